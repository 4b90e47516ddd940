import CFetchQSupport
import CJansson
import Glibc
import Logging
import Synchronization

/// The runtime: executes the scheduler state machine's decisions on worker
/// threads, the delivery thread (or the poll-mode caller) and a timer thread.
/// The state machine decides; this class only carries out its actions.
///
/// `@unchecked Sendable`: `machine` (which also holds each live operation
/// object), `queues`,
/// `shuttingDown`, `eventHandler`, `stores`, `coalesced` and `transport` are
/// guarded by `lock` (they are internal only so that the Engine+*.swift
/// extensions can use them: touch them with the lock held); `workers`,
/// `delivery` and `timer` are set once in init and are thread-safe themselves.
public final class Engine: @unchecked Sendable {
    typealias Machine = SchedulerStateMachine<OperationResult, Operation>

    public let config: EngineConfig
    /// The search settings of a submit whose options hold only common keys
    /// (or none): they depend on the config alone, so they are read once.
    /// Nil when the config has no "search" (such a submit must name a url).
    let defaultSearch: SearchTemplate?
    /// The engine's logger (swift-log), at config "log"'s level.
    public let logger: Logger
    let logSink = LogSink()
    let lock = ConditionLock()
    /// Guards network operations' `transfer`, `transport` and `handedTo`,
    /// taken inside `lock` by those who change or read them under it, and
    /// alone by the thread that publishes a started transfer's id
    /// (`startTransfer`). Publishing under `lock` made the two transfer
    /// threads meet there a second time per transfer (bench/findings.md,
    /// Sixteenth round).
    let transferLock = ConditionLock()
    var machine: Machine
    var queues: [QueueID: Queue] = [:]
    /// Closed queues whose `Queue` objects someone may still hold (Swift
    /// code): their ids are not given to new queues while one lives, so
    /// that a call on it never reaches another queue (guarded by `lock`).
    var closedQueues: [QueueID: WeakQueue] = [:]

    struct WeakQueue {
        weak var queue: Queue?
    }
    /// Operations submitted whose callback has not returned yet (its own
    /// lock, taken after this one).
    let outstanding = Outstanding()
    var shuttingDown = false
    /// `shuttingDown`, readable without the lock (submits check it first).
    let shutdownStarted = Atomic<Bool>(false)
    var eventHandler: EventHandler?
    /// The item stores searches used last, kept open between searches
    /// (ItemStore.shared holds them weakly), most recent last: at most
    /// `keptStores`. An older one closes once no search holds it (a service
    /// writing a file a day kept every day's file open, 3 descriptors each).
    var stores: [ItemStore] = []
    static let keptStores = 8
    /// Completions and events decided under the lock, handed to the delivery
    /// queue in one batch at the end of `resolve` (still under the lock, so
    /// in the order they were decided).
    var pendingPosts: [Delivery.Item] = []
    /// Completions posted so far (guarded by the lock): see `post`.
    var completionsPosted: UInt64 = 0
    /// Submits not yet booked (see SubmitInbox), and what booking them
    /// started, carried out by whoever unlocks (guarded by `lock`).
    let inbox = SubmitInbox()
    var inboxWork: [Work] = []
    /// The next operation id: every id is handed out here, so that a
    /// submit can have its id before the scheduler books it.
    let nextID = Atomic<OpID>(1)
    /// Lets submits with "depends_on" through the inbox (the scheduler's).
    let gate = DependencyGate()
    /// Scratch space for the scheduler's actions at an operation's end,
    /// kept between uses (guarded by `lock`).
    var actionScratch: [Machine.Action] = []
    /// In-flight shared transfers by request key.
    var coalesced: [CoalesceKey: SharedTransfer] = [:]
    /// The HTTP cache (config "cache"), nil when its size is 0.
    public let httpCache: HTTPCache?
    /// Made with the first network operation, `config.transferThreads` of them (guarded by `lock`).
    var transports: [CurlTransport] = []
    /// `let`s: an engine thread calls into them for every operation, and
    /// calling through a `var` retained and released the object each time
    /// (one refcount that every engine thread wrote).
    let workers: WorkerPool
    let delivery: Delivery
    var timer: DeadlineTimer!

    public init(config: EngineConfig) throws(FetchQError) {
        self.config = config
        // jansson's allocation functions with a per-thread cache of freed
        // blocks, process-wide, unless FETCHQ_JANSSON_CACHE=0 or another
        // allocator is set (fetchq.h, "jansson's allocator").
        if fqs_jansson_cache_wanted(getenv("FETCHQ_JANSSON_CACHE")) != 0 { _ = fqs_jansson_cache_install() }
        // (A config that fails here fails every such submit instead, with its message.)
        var none = try OptionReader(nil, context: "options")
        defaultSearch = config.search == nil ? nil
            : try? SearchTemplate(reading: &none, config: config) { (_: String) throws(FetchQError) -> ItemStore in
                throw FetchQError(.invalid, "no store without options")  // not reached: nothing to read
            }
        let sink = logSink
        let level = LogLevelName.names.first(where: { $0.0 == config.log })?.1
        var logger = Logger(label: "fetchq") { _ in EngineLogHandler(sink: sink, logLevel: level ?? .critical) }
        if level == nil { logger.handler = SwiftLogNoOpLogHandler() }
        self.logger = logger
        httpCache = config.cacheMaxBytes > 0 ? try HTTPCache(maxBytes: config.cacheMaxBytes, persistPath: config.cachePath) : nil
        machine = Machine(config: .init(
            agingNanos: UInt64(config.agingMs) * 1_000_000,
            maxPerHost: config.maxPerHost,
            history: config.history,
            historyValues: min(config.historyValues, config.history),
            rateLimits: config.rateLimits.mapValues { .init(perSecond: $0.perSecond, burst: $0.burst) },
            isLight: { $0.isLight },
            historyForm: { $0.historyForm ?? $0 }), gate: gate)
        delivery = try Delivery(mode: config.delivery, delivered: { [outstanding] queues, lastSeq in
            outstanding.done(queues, lastCompletion: lastSeq)  // without the engine lock
        }, returned: { [outstanding] seq in outstanding.returned(seq) })
        workers = WorkerPool(count: config.workers)
        let owner = selfPointer
        // A thread the system refuses (its limits): what was started stops,
        // and fq_engine_new returns NULL with the message.
        try delivery.start(owner: owner)
        do {
            try workers.start(owner: owner)
            timer = try DeadlineTimer { [unowned self] in expireDeadlines() }
        } catch {
            workers.stop()
            delivery.stop()
            throw error
        }
        logger.info("engine started", metadata: ["workers": "\(config.workers)", "delivery": "\(config.delivery)"])
    }

    /// Sends log lines to `callback` instead of standard error (nil: back
    /// to standard error). Called on whichever thread logs.
    public func setLogCallback(_ callback: (@Sendable (Logger.Level, String) -> Void)?) {
        logSink.set(callback)
    }

    public convenience init(json: UnsafePointer<json_t>?) throws(FetchQError) {
        try self.init(config: EngineConfig(json: json))
    }

    /// Identifies this engine in the thread-local "current engine" marker.
    var selfPointer: UnsafeRawPointer { UnsafeRawPointer(Unmanaged.passUnretained(self).toOpaque()) }

    /// True on this engine's own threads and inside its callbacks.
    var onOwnThread: Bool { fqs_current_engine() == selfPointer }

    // MARK: - Queues

    public func makeQueue(name: String, maxConcurrent: Int) throws(FetchQError) -> Queue {
        guard maxConcurrent >= 1 else {
            throw FetchQError(.invalid, "max_concurrent must be at least 1, got \(maxConcurrent)")
        }
        lockEngine()
        defer { unlockEngine() }
        guard !shuttingDown else { throw FetchQError(.shutdown, "the engine is being freed") }
        guard machine.queueNamed(name) == nil else {
            throw FetchQError(.invalid, "a queue named \"\(name)\" already exists")
        }
        // A forgotten queue's id, once no callback of it is pending and
        // nobody holds its old Queue object.
        let id = machine.addQueue(name: name, maxConcurrent: maxConcurrent) { [outstanding] old in
            outstanding.count(old) == 0 && closedQueues[old]?.queue == nil
        }
        closedQueues[id] = nil
        inbox.openQueue(id)
        let queue = Queue(id: id, name: name, engine: self)
        queues[id] = queue
        return queue
    }

    func setMaxConcurrent(_ queue: QueueID, _ n: Int) throws(FetchQError) {
        guard n >= 1 else { throw FetchQError(.invalid, "max_concurrent must be at least 1, got \(n)") }
        run { $0.setMaxConcurrent(queue, n, now: monotonicNanos()) }
    }

    func setSuspended(_ queue: QueueID, _ suspended: Bool) {
        run { $0.setSuspended(queue, suspended, now: monotonicNanos()) }
    }

    func cancelQueue(_ queue: QueueID) -> Int {
        var count = 0
        run { m in
            let r = m.cancelQueue(queue, now: monotonicNanos())
            count = r.count
            return r.actions
        }
        return count
    }

    func closeQueue(_ queue: QueueID) {
        run { m in
            closedQueues[queue] = WeakQueue(queue: queues[queue])
            queues[queue] = nil
            inbox.closeQueue(queue)  // what came before is booked, then cancelled
            return m.closeQueue(queue, now: monotonicNanos())
        }
    }


    // MARK: - Control

    public func cancel(_ id: OpID) throws(FetchQError) {
        try runThrowing { $0.cancel(id, now: monotonicNanos()) }
    }

    public func cancelGroup(_ group: String) -> Int {
        var count = 0
        run { m in
            let r = m.cancelGroup(group, now: monotonicNanos())
            count = r.count
            return r.actions
        }
        return count
    }

    public func cancelAll() -> Int {
        var count = 0
        run { m in
            let r = m.cancelAll(now: monotonicNanos())
            count = r.count
            return r.actions
        }
        return count
    }

    public func setPriority(_ id: OpID, _ priority: Priority) throws(FetchQError) {
        try runThrowing { m in
            let now = monotonicNanos()
            var own = priority
            // The leading caller runs the transfer for its callers too: it
            // does not go below the highest priority one of them asked for.
            let leads = m.owner(of: id)?.leads.flatMap { $0.done ? nil : $0 }
            if let floor = leads?.callersPriority, floor.rawValue > own.rawValue { own = floor }
            var result = m.setPriority(id, own, now: now)
            if case .success = result, let leads { leads.priority = own }
            if case .success(let actions) = result, let shared = m.owner(of: id)?.shared, !shared.done {
                result = .success(actions + shared.lift(to: priority, in: &m, now: now))
            }
            return result
        }
    }

    /// `fq_state`'s and `fq_wait`'s error for an id they do not know.
    static func unknown(_ id: OpID) -> FetchQError {
        FetchQError(.notFound, "no operation \(id) (never submitted, or no longer in the engine's history)")
    }

    /// Where operation `id` stands (`fq_state`). Every operation whose
    /// submit returned before the call is booked first (`lockEngine`).
    public func state(of id: OpID) throws(FetchQError) -> OperationState {
        lockEngine()
        let state = machine.reportedState(of: id)
        unlockEngine()
        guard let state else {
            throw Self.unknown(id)
        }
        return state
    }

    /// `id` no longer waits for `dep` (NSOperation.removeDependency; see
    /// `Scheduler.removeDependency`).
    public func removeDependency(_ id: OpID, on dep: OpID) throws(FetchQError) {
        try runThrowing { $0.removeDependency(id, on: dep, now: monotonicNanos()) }
    }

    public func addDependency(_ id: OpID, on dep: OpID) throws(FetchQError) {
        lockEngine()
        // Read before: a dependency that already failed ends the operation
        // at once (it is no longer live after).
        let owner = machine.owner(of: id)
        // A search-all's queries not sent yet wait for an unfinished `dep` too.
        let queries = machine.isLive(dep) ? machine.unstartedQueries(of: id).compactMap { machine.owner(of: $0) } : []
        switch machine.addDependency(id, on: dep, now: monotonicNanos()) {
        case .success(let ended):
            var work: [Work] = []
            var actions: [Machine.Action] = []
            for op in [owner].compactMap({ $0 }) + queries {
                guard let shared = op.leads else { continue }
                // The leading caller of a shared transfer now waits for a
                // dependency: the callers sharing it should not, nor end
                // with it when that dependency already failed (they ended
                // FQ_ERR_DEPENDENCY naming a dependency not theirs; the
                // stress program found it).
                op.leads = nil
                actions += leaderEnded(shared, .cancelled, .cancelled, .cancelled, &work)
            }
            actions += ended
            resolve(actions, into: &work)
            unlockEngine()
            execute(work)
        case .failure(let error):
            unlockEngine()
            throw error
        }
    }

    // MARK: - The engine lock

    /// A new operation id (never reused).
    @inline(__always)
    func newID() -> OpID { nextID.wrappingAdd(1, ordering: .relaxed).oldValue }

    /// Takes the engine lock and books the submits waiting in the inbox.
    /// Every path that reads or changes the scheduler takes the lock this
    /// way (reading a field of an operation needs only `lock`).
    @inline(__always)
    func lockEngine() {
        lock.lock()
        if let entries = inbox.claim() { admit(entries) }
    }

    /// How many submits from the inbox a thread books, at most, on its way
    /// out of the engine lock before it hands the rest to a worker job (so
    /// that a steady stream of submits cannot keep it there).
    static let inboxBudget = 4096

    /// Books the submits that came meanwhile, lets the lock go, then
    /// starts what booking them started.
    @inline(__always)
    func unlockEngine() {
        var budget = Self.inboxBudget
        var handOver = false
        loop: while true {
            switch inbox.release(stop: budget <= 0) {
            case .book(let entries):
                admit(entries)
                budget -= entries.count
            case .done: break loop
            case .handOver:
                handOver = true
                break loop
            }
        }
        var work: [Work] = []
        swap(&work, &inboxWork)
        lock.unlock()
        if !work.isEmpty { execute(work) }
        if handOver { workers.submit(qos: .default) { [self] in bookInbox() } }
    }

    /// With the lock held: books submits from the inbox, in order. One the
    /// scheduler refuses (its queue was closed after the submit returned)
    /// ends cancelled, as it would have in the queue.
    private func admit(_ entries: [SubmitInbox.Entry]) {
        var actions: [Machine.Action] = []
        var queue = -1, count = 0
        var gated = false
        for entry in entries {
            if entry.queue != queue {
                if count > 0 { outstanding.add(queue, count) }
                queue = entry.queue
                count = 0
            }
            count += 1
            // The entry's reference goes to the slot (or, refused, is let go).
            if !machine.submitPlain(id: entry.id, queue: entry.queue, priority: entry.priority, qos: entry.qos,
                                    group: entry.group, startDeadline: entry.startDeadline,
                                    dependsOn: entry.dependsOn, adopting: entry.op,
                                    now: entry.submittedAt, into: &actions) {
                let op = entry.op.takeRetainedValue()
                post(OperationResult(id: op.id, outcome: .cancelled, status: .cancelled, reason: .cancelled), of: op)
            }
            if entry.gatePhase >= 0 {
                gate.leave(Int(entry.gatePhase))
                gated = true
            }
        }
        if count > 0 { outstanding.add(queue, count) }
        // What history dropped while these were on their way may go now.
        if gated { machine.freeHidden() }
        resolve(actions, into: &inboxWork)
    }

    // MARK: - Carrying out the state machine's actions

    enum Work {
        /// A block or async operation.
        case start(Operation)
        /// A network operation, its attempt booked (`bookAttempt`). Boxed
        /// (`indirect`): inline, the job made every `Work` 368 bytes, copied
        /// twice per item by `execute`, and the enum kept its case in the
        /// top bits of the payload's last word, which a `.start` never
        /// writes whole: valgrind's memcheck reported reading the case of
        /// every `.start` as a jump on uninitialised memory
        /// (docs/reliability.md, Findings 4).
        indirect case startTransfer(Operation, NetworkJob, attempt: Int, transports: [CurlTransport])
        case abort(CurlTransport, TransferID)
        /// Something is due later (a rate-limit token): re-arm the timer.
        case kickTimer
        /// Values dropped from history: released after unlocking.
        case release([OperationResult])
    }

    /// Applies an event to the state machine under the lock, then carries out
    /// the resulting actions outside it.
    func run(_ event: (inout Machine) -> [Machine.Action]) {
        lockEngine()
        let work = resolve(event(&machine))
        unlockEngine()
        execute(work)
    }

    func runThrowing(_ event: (inout Machine) -> Result<[Machine.Action], FetchQError>) throws(FetchQError) {
        lockEngine()
        switch event(&machine) {
        case .success(let actions):
            let work = resolve(actions)
            unlockEngine()
            execute(work)
        case .failure(let error):
            unlockEngine()
            throw error
        }
    }

    /// Turns actions into work on operation objects. Called with the lock
    /// held. Completions and events (with those the caller queued in
    /// `pendingPosts` before) are posted to the delivery queue right here,
    /// under the lock, so their order is the order in which the scheduler
    /// decided them (a child's event before its parent's callback, a
    /// dependency's callback before its dependents'). Every path that queues
    /// in `pendingPosts` calls this before unlocking.
    func resolve(_ actions: [Machine.Action]) -> [Work] {
        var work: [Work] = []
        resolve(actions, into: &work)
        return work
    }

    /// `pickup` (a worker ending its job): the block or async operation
    /// started first, when nothing comes before it in `work`, is put there
    /// instead (see `execute`): the common end, "this one ended, that one
    /// starts", then needs no work list. Not retained, and not read here:
    /// its slot keeps it until it ends, which it cannot before it runs, and
    /// the worker takes its reference after the lock.
    func resolve(_ actions: [Machine.Action], into work: inout [Work], inline: UnsafeMutablePointer<[Delivery.Item]>? = nil,
                 pickup: UnsafeMutablePointer<Unmanaged<Operation>?>? = nil) {
        var actions = actions
        var next = 0
        while next < actions.count {
            let current = next
            next += 1
            switch actions[current] {
            case .start(_, let dependencies, let owner, let network):
                guard let owner else { continue }
                if !dependencies.isEmpty {
                    let op = owner.takeUnretainedValue()
                    op.dependencies = dependencies
                    for (i, dep) in dependencies.enumerated() where dep.payload == nil && dep.outcome == .succeeded {
                        // A network dependency whose result left history
                        // ("history_values") before this operation was submitted.
                        op.dependencies[i].payload = OperationResult(
                            id: dep.id, outcome: .succeeded, status: .ok,
                            message: "the result of operation \(dep.id) is no longer kept: at least history_values "
                                + "(\(config.historyValues)) network operations finished after it",
                            value: nil)
                    }
                }
                if network {
                    work.append(bookAttempt(owner.takeUnretainedValue()))
                } else if let pickup, work.isEmpty, pickup.pointee == nil {
                    pickup.pointee = owner
                } else {
                    work.append(.start(owner.takeUnretainedValue()))
                }
            case .complete(let id, let outcome, let status, let reason, let owner):
                guard let op = owner else { continue }
                if let shared = op.carries {
                    // A carrier that never ran (cancelled, waited too long):
                    // its callers end the same way, each by its own deadline.
                    actions += status == .queueTimeout ? endCallersPastTheirWait(shared, &work)
                        : endCallers(shared, outcome, status, reason, &work)
                    continue
                }
                if let shared = op.leads {
                    // A leading caller that never got to run its transfer.
                    op.leads = nil
                    actions += leaderEnded(shared, outcome, status, reason, &work)
                }
                let result = OperationResult(id: id, outcome: outcome, status: status, reason: reason)
                // A family's child events are posted before the parent's callback.
                let familyActions = op.family != nil ? familyEnded(op, result, &work) : []
                post(result, of: op)
                actions += familyActions
            case .cancelRunning(let id):
                guard let op = machine.owner(of: id) else { continue }
                // A leading caller is marked as its transfer is handed over
                // (`handOver`): marked first, a transfer starting meanwhile
                // (its first, or a retry) saw it cancelled and not yet handed
                // over, and aborted the transfer its callers were to get
                // (the ninth review).
                if op.leads == nil { op.markCancelled() }
                if let shared = op.shared {
                    // A coalesced caller detaches; the last one out cancels the transfer.
                    shared.callers.removeAll { $0 === op }
                    op.shared = nil
                    actions += endAttached(op, .cancelled, .cancelled, .cancelled, &work)
                    if shared.callers.isEmpty && !shared.done && !shared.ownerLed {
                        forget(shared)
                        if case .success(let more) = machine.cancel(shared.carrier, now: monotonicNanos()) { actions += more }
                    }
                    continue
                }
                if let shared = op.leads {
                    // A leading caller: others still waiting keep the
                    // transfer, which a carrier takes over as it is.
                    op.leads = nil
                    if handOver(op, shared, &actions, &work) { continue }
                    op.markCancelled()
                }
                transferLock.lock()
                if let transfer = op.transfer, let transport = op.transport { work.append(.abort(transport, transfer)) }
                transferLock.unlock()
            }
        }
        if machine.waitsForTokens { work.append(.kickTimer) }
        let released = machine.takeReleased()
        if !released.isEmpty { work.append(.release(released)) }
        if !pendingPosts.isEmpty {
            if let inline, delivery.claimInline() {
                swap(&inline.pointee, &pendingPosts)
                return
            }
            if pendingPosts.count == 1 {
                delivery.post(pendingPosts.removeLast())  // the usual one: moved, not copied
            } else {
                delivery.post(contentsOf: pendingPosts)
                pendingPosts.removeAll(keepingCapacity: pendingPosts.count <= 1024)
            }
        }
    }

    /// With the lock held: queues `op`'s completion for `resolve` to post,
    /// numbered in posting order (`slot`: the scheduler's, when the caller
    /// has it).
    @inline(__always)
    func post(_ result: OperationResult, of op: Operation, slot: Int? = nil) {
        result.callback = op.callback
        result.queue = op.queue
        completionsPosted &+= 1
        result.completionSeq = completionsPosted
        if let slot {
            machine.noteCompletion(slot: slot, id: op.id, completionsPosted)
        } else {
            machine.noteCompletion(op.id, completionsPosted)
        }
        pendingPosts.append(.completion(result))
    }

    /// With the lock held: the leading caller of a shared transfer ended
    /// before the transfer ran (cancelled, or it waited longer than its
    /// max_wait_ms). A cancel is the leader's own: a carrier is queued for
    /// the callers still attached. Any other end is shared by them (they have
    /// the same limits), as a carrier's would be.
    func leaderEnded(_ shared: SharedTransfer, _ outcome: Outcome, _ status: FQStatus, _ reason: EndReason,
                     _ work: inout [Work]) -> [Machine.Action] {
        shared.ownerLed = false
        if status == .queueTimeout { return endCallersPastTheirWait(shared, &work) }
        if reason == .cancelled, !shared.callers.isEmpty, let actions = queueCarrier(shared, &work) {
            return actions
        }
        return endCallers(shared, outcome, status, reason, &work)
    }

    /// With the lock held: the operation that was to run a shared transfer
    /// waited in its queue longer than "max_wait_ms". Each caller's limit
    /// counts from its own submit: those past it end FQ_ERR_QUEUE_TIMEOUT,
    /// the others get a carrier whose limit is the oldest one's. (A caller
    /// that joined late ended with the first: the ninth review.)
    private func endCallersPastTheirWait(_ shared: SharedTransfer, _ work: inout [Work]) -> [Machine.Action] {
        let now = monotonicNanos()
        let limit = UInt64(shared.maxWaitMs) * 1_000_000
        var actions: [Machine.Action] = []
        var left: [Operation] = []
        for caller in shared.callers {
            if caller.submittedAt &+ limit > now {
                left.append(caller)
            } else {
                actions += endAttached(caller, .failed, .queueTimeout, .text(Self.waitedTooLong(caller.id)), &work)
            }
        }
        shared.callers = left
        if !left.isEmpty, let more = queueCarrier(shared, &work) { return actions + more }
        return actions + endCallers(shared, .failed, .queueTimeout, .text(""), &work)
    }

    /// With the lock held: identical GETs submitted from now on do not
    /// attach to `shared` (a newer transfer under its key stays). One probe of
    /// the table, not a lookup and then a removal (on every search's end,
    /// under the lock).
    func forget(_ shared: SharedTransfer) {
        if let i = coalesced.index(forKey: shared.key), coalesced.values[i] === shared { coalesced.remove(at: i) }
    }

    /// With the lock held: a shared transfer will not run; its callers end
    /// as the operation that was to run it did.
    private func endCallers(_ shared: SharedTransfer, _ outcome: Outcome, _ status: FQStatus, _ reason: EndReason,
                            _ work: inout [Work]) -> [Machine.Action] {
        shared.done = true
        forget(shared)
        var actions: [Machine.Action] = []
        for caller in shared.callers {
            // Each caller's own id in its message, not the leader's or carrier's.
            let own = status == .queueTimeout ? EndReason.text(Self.waitedTooLong(caller.id)) : reason
            actions += endAttached(caller, outcome, status, own, &work)
        }
        shared.callers = []
        return actions
    }

    /// With the lock held: queues an internal carrier for the callers of a
    /// shared transfer whose leader left before running it, in the first of
    /// their queues that still takes work, with the callers' max_wait_ms
    /// counted from the oldest caller's submit. Nil when no queue takes it.
    private func queueCarrier(_ shared: SharedTransfer, _ work: inout [Work]) -> [Machine.Action]? {
        let now = monotonicNanos()
        for caller in shared.callers {
            guard case .network(let job) = caller.body else { continue }
            var spec = Machine.Spec(queue: caller.queue)
            spec.priority = shared.callersPriority ?? shared.priority  // theirs, not the leader's
            spec.qos = caller.qos
            spec.host = job.host
            spec.isInternal = true
            spec.carried = shared.callers.map(\.id)
            spec.id = newID()
            if shared.maxWaitMs > 0 {
                spec.startDeadline = shared.callers[0].submittedAt + UInt64(shared.maxWaitMs) * 1_000_000
                work.append(.kickTimer)
            }
            if let at = shared.retryAt, at > now {
                // The leader waited to retry (Retry-After, backoff): so do they.
                spec.notBefore = at
                work.append(.kickTimer)
            }
            let carrier = Operation(id: 0, queue: caller.queue, qos: caller.qos, body: .network(job), callback: .none,
                                    engine: self)
            spec.owner = carrier
            var actions: [Machine.Action] = []
            guard case .success(let id) = machine.submit(spec, now: now, into: &actions) else { continue }
            carrier.id = id
            carrier.carries = shared
            carrier.attempts = shared.attempts
            carrier.nextAttemptCache = shared.nextAttemptCache
            shared.carrier = id
            return actions
        }
        return nil
    }

    /// With the lock held: a running leading caller was cancelled. With
    /// callers still attached, a carrier takes over its slot and its transfer
    /// (which goes on), and the leader ends cancelled now: returns true.
    /// False when its transfer is to be aborted (no caller left, or the
    /// callers got a queued carrier of their own).
    private func handOver(_ leader: Operation, _ shared: SharedTransfer, _ actions: inout [Machine.Action],
                          _ work: inout [Work]) -> Bool {
        shared.ownerLed = false
        guard !shared.done else { return false }
        guard !shared.callers.isEmpty, case .network(let job) = leader.body,
              let id = machine.handOver(leader.id, newID: newID(), now: monotonicNanos(), into: &actions) else {
            actions += leaderEnded(shared, .cancelled, .cancelled, .cancelled, &work)
            return false
        }
        let carrier = Operation(id: id, queue: leader.queue, qos: leader.qos, body: .network(job), callback: .none,
                                engine: self, submittedAt: leader.submittedAt)
        carrier.carries = shared
        carrier.startedAt = leader.startedAt
        carrier.attempts = leader.attempts
        transferLock.withLock {
            // One step for `startTransfer`'s publishing: it gives the id to
            // the carrier, or the carrier gets the id it gave the leader;
            // either way it sees the leader cancelled only once handed over.
            carrier.transfer = leader.transfer
            carrier.transport = leader.transport
            leader.handedTo = carrier
            leader.markCancelled()
        }
        machine.setOwner(carrier, of: id)
        shared.carrier = id
        let result = OperationResult(id: leader.id, outcome: .cancelled, status: .cancelled, reason: .cancelled)
        post(result, of: leader)
        return true
    }

    /// With the lock held: the operation running a shared transfer ends;
    /// returns the callers still attached (they get their results from the
    /// transfer's outcome) and lets no more attach.
    func detachCallers(_ runner: Operation) -> [Operation] {
        guard let shared = runner.carries ?? runner.leads else { return [] }
        runner.leads = nil
        guard !shared.done else { return [] }
        shared.done = true
        forget(shared)
        defer { shared.callers = [] }  // callers point at `shared`: no cycle left behind
        return shared.callers
    }

    /// With the lock held: who hears about a transfer's progress.
    func progressTargets(_ op: Operation) -> [OpID] {
        let runner = op.handedTo ?? op
        if let shared = runner.carries { return shared.callers.map(\.id) }
        if let shared = runner.leads { return [op.id] + shared.callers.map(\.id) }
        return [op.id]
    }

    /// With the lock held: ends a coalesced caller that has not got its result.
    func endAttached(_ caller: Operation, _ outcome: Outcome, _ status: FQStatus, _ reason: EndReason,
                     _ work: inout [Work]) -> [Machine.Action] {
        guard machine.state(of: caller.id) == .attached else { return [] }
        let result = OperationResult(id: caller.id, outcome: outcome, status: status, reason: reason)
        post(result, of: caller)
        return machine.finished(caller.id, outcome, payload: result, now: monotonicNanos())
    }

    /// With the lock held, when an operation of a search-all family ended
    /// (called before its own callback is posted): the child event, and the
    /// cancellations the family implies (a cancelled parent cancels its
    /// children; with fail_fast a failed child cancels its siblings). Returns
    /// the actions of those cancellations. A cancelled parent's children
    /// whose ends were not handled here yet get their events now, as
    /// cancelled: their ends come after the parent's callback, which is after
    /// every child event. (Not only the live ones: a bulk cancel — a group,
    /// a queue, everything, or freeing the engine — ends the parent and its
    /// queued children in one pass, before any of their ends is handled.)
    func familyEnded(_ op: Operation, _ result: OperationResult, _ work: inout [Work]) -> [Machine.Action] {
        guard let family = op.family else { return [] }
        var cancels: [OpID] = []
        if op.id == family.parent {
            if result.outcome == .cancelled {
                cancels = family.children
                if family.childEvents && !family.parentEnded, let handler = eventHandler {
                    for child in family.children where family.endings[child] == nil {
                        let ended = OperationResult(id: child, outcome: .cancelled, status: .cancelled,
                                                    message: "operation \(child) was cancelled", value: nil)
                        let event = OperationEvent(id: family.parent, kind: .child, child: ended,
                                                   query: family.queries[child])
                        pendingPosts.append(.event(event, handler))
                    }
                }
            }
            family.parentEnded = true
        } else {
            family.endings[op.id] = (result.status, result.message)
            if family.childEvents && !family.parentEnded, let handler = eventHandler {
                let event = OperationEvent(id: family.parent, kind: .child, child: result, query: family.queries[op.id])
                pendingPosts.append(.event(event, handler))
            }
            if family.failFast && result.outcome == .failed && !family.failedFast {
                family.failedFast = true
                cancels = family.children.filter { $0 != op.id }
            }
        }
        var actions: [Machine.Action] = []
        let now = monotonicNanos()
        for id in cancels where machine.isLive(id) {
            if case .success(let more) = machine.cancel(id, now: now) { actions += more }
        }
        return actions
    }

    /// Carries out work after unlocking. `selfPickup`: called by a worker
    /// at the end of its job. The first block/async operation started here is
    /// then returned for that worker to run next itself (no pool round trip,
    /// nobody woken) — unless other jobs wait in the pool, which go first.
    ///
    /// `pickup`: the first operation started, taken out of `work` by
    /// `resolve` (it comes before everything in `work`).
    @discardableResult
    func execute(_ work: [Work], pickup unretained: Unmanaged<Operation>? = nil, selfPickup: Bool = false) -> Operation? {
        var selfPickup = selfPickup
        var next: Operation? = nil
        if let unretained {
            // The worker's own reference, taken here (the slot keeps its own).
            if selfPickup && workers.isIdle {
                next = unretained.retain().takeRetainedValue()
            } else {
                let qos = unretained._withUnsafeGuaranteedRef { $0.qos }
                workers.submit(qos: qos, wake: !selfPickup, job: .body(unretained.retain()))
            }
            selfPickup = false
        }
        for item in work {
            switch item {
            case .startTransfer(let op, let job, let attempt, let existing):
                startTransfer(op, job, attempt: attempt, existing: existing)
            case .start(let op):
                if selfPickup && workers.isIdle {
                    next = op
                    selfPickup = false
                } else {
                    workers.submit(qos: op.qos, wake: !selfPickup, job: .run(op))
                    selfPickup = false
                }
            case .abort(let transport, let transfer): transport.cancel(transfer)
            case .kickTimer: timer.kick()
            case .release: break  // the values are freed as this work list goes
            }
        }
        return next
    }

    /// On a worker: runs a block or async body, then any operation its end
    /// handed to this worker (see `execute`).
    func runBody(_ op: consuming Operation) {
        var current: Operation? = op
        while let op = current.take() { current = runOne(op) }
    }

    /// `runBody` for a worker job: `op` is the reference taken by hand for it.
    func runBody(_ op: Unmanaged<Operation>) {
        runBody(op.takeRetainedValue())
    }

    private func runOne(_ op: Operation) -> Operation? {
        // Started (handed to the workers) but cancelled before a worker took
        // it up: its body never runs, as for one cancelled in its queue (with
        // more started than workers, it waited for one; the sixth review).
        if op.isCancelled {
            guard op.claimFinish() else { return nil }
            return bodyEnded(op, value: nil, error: nil, onWorker: true)
        }
        let value: JSONRef?
        switch op.body {
        case .block(let body): value = body(op)
        case .cBlock(let fn, let userdata): value = JSONRef(owned: fn(op.handle, userdata))
        case .async(let body):
            body(op)
            return nil
        case .cAsync(let fn, let userdata):
            fn(op.handle, userdata)
            return nil
        case .network:
            preconditionFailure("network operations run on the transport")
        }
        guard op.claimFinish() else { return nil }
        return bodyEnded(op, value: value, error: op.errorMessage, onWorker: true)
    }

    /// A running operation's body ended (block returned, async finished).
    /// `onWorker`: see `finishRunning`; returns what it returns.
    @discardableResult
    func bodyEnded(_ op: Operation, value: JSONRef?, error: String?, onWorker: Bool = false) -> Operation? {
        let result: OperationResult
        if op.isCancelled {
            result = OperationResult(id: op.id, outcome: .cancelled, status: .cancelled,
                                     message: "operation \(op.id) was cancelled", value: nil)
        } else if let error {
            result = OperationResult(id: op.id, outcome: .failed, status: op.errorStatus, message: error, value: nil)
        } else {
            result = OperationResult(id: op.id, outcome: .succeeded, status: .ok, message: nil, value: value)
        }
        return finishRunning(op, result, onWorker: onWorker)
    }

    /// Books a running operation's result and delivers it. `onWorker`: called
    /// by a worker at the end of its job, which must run the operation
    /// returned (see `execute`); nil otherwise.
    @discardableResult
    func finishRunning(_ op: Operation, _ result: OperationResult, onWorker: Bool = false,
                       endCallers: ([Operation], OperationResult) -> Void = Engine.endCallersAlike) -> Operation? {
        let now = monotonicNanos()  // read before the lock: it need not be held longer for it
        lockEngine()
        // A leading caller cancelled while its transfer ran for others: the
        // carrier that took the transfer over ends instead (the leader has
        // ended already).
        if let runner = op.handedTo {
            return finishLocked(runner, result, now: now, onWorker: onWorker, endCallers: endCallers)
        }
        return finishLocked(op, result, now: now, onWorker: onWorker, endCallers: endCallers)
    }

    /// `finishRunning` with the lock held, for the operation that ends.
    /// (Its own function so that the common end passes `op` and `result`
    /// along without copying a reference.)
    private func finishLocked(_ op: Operation, _ result: OperationResult, now: UInt64, onWorker: Bool,
                              endCallers: ([Operation], OperationResult) -> Void) -> Operation? {
        guard let slot = machine.runningSlot(op.id) else {
            unlockEngine()
            return nil
        }
        // A cancel is applied under this lock: if one got in before the end
        // was booked, the operation ends cancelled, so that a cancel that
        // returned FQ_OK always means FQ_CANCELLED.
        let replaced: OperationResult?
        if op.carries != nil {
            replaced = OperationResult(id: op.id, outcome: result.outcome, status: result.status, message: result.message,
                                       value: nil)
        } else if op.isCancelled && result.outcome != .cancelled {
            replaced = OperationResult(id: op.id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(op.id) was cancelled", value: nil, http: result.http)
        } else {
            replaced = nil
        }
        if let replaced { return finishBooked(op, slot, replaced, now: now, onWorker: onWorker, endCallers: endCallers) }
        return finishBooked(op, slot, result, now: now, onWorker: onWorker, endCallers: endCallers)
    }

    /// `finishRunning` with the lock held and the result final.
    private func finishBooked(_ op: Operation, _ slot: Int, _ result: OperationResult, now: UInt64, onWorker: Bool,
                              endCallers: ([Operation], OperationResult) -> Void) -> Operation? {
        let callers = detachCallers(op)
        // The lock's own scratch array: no allocation per end.
        var actions: [Machine.Action] = []
        swap(&actions, &actionScratch)
        machine.finished(slot: slot, result.outcome, payload: result, now: now, into: &actions)
        var work: [Work] = []
        // Posted under the lock, before what this end unblocks: a child's
        // event, then this callback, then the dependents'.
        let familyActions = op.family == nil ? nil : familyEnded(op, result, &work)
        if op.carries == nil {  // a carrier is internal: nobody waits for its callback
            post(result, of: op, slot: slot)
        }
        var inlineBatch: [Delivery.Item] = []
        var pickup: Unmanaged<Operation>? = nil
        if let familyActions, !familyActions.isEmpty {
            // Scoped: `all` shares the scratch buffer, which must be unique
            // again before it is emptied below (or emptying would copy it).
            let all = familyActions + actions
            resolveEnd(all, onWorker: onWorker, &work, &inlineBatch, &pickup)
        } else {
            resolveEnd(actions, onWorker: onWorker, &work, &inlineBatch, &pickup)
        }
        if actions.count <= 4 {
            while actions.popLast() != nil {}  // keeps the buffer, unlike a fresh array
        } else {
            actions.removeAll(keepingCapacity: actions.capacity <= 1024)
        }
        swap(&actions, &actionScratch)
        let dropped = machine.takeDropped()
        unlockEngine()
        withExtendedLifetime(dropped) {}  // freed here, not under the lock
        if !callers.isEmpty { endCallers(callers, result) }
        if result.outcome == .failed {
            logger.info("operation failed", metadata: ["id": "\(op.id)", "status": "\(result.status)", "error": "\(result.message ?? "")"])
        }
        if !inlineBatch.isEmpty {
            // Start what this end unblocked before running the callbacks, on
            // another worker: kept for this one, it waited for them, however
            // long, while others were idle (the sixth review).
            _ = execute(work, pickup: pickup, selfPickup: false)
            delivery.runInline(inlineBatch)
            return nil
        }
        return execute(work, pickup: pickup, selfPickup: onWorker)
    }

    /// `finishRunning`'s `resolve`: a worker's end hands it the next
    /// operation (and in inline mode the callbacks to run).
    @inline(__always)
    private func resolveEnd(_ actions: [Machine.Action], onWorker: Bool, _ work: inout [Work],
                            _ inlineBatch: inout [Delivery.Item], _ pickup: inout Unmanaged<Operation>?) {
        if onWorker && delivery.mode == .inline {
            resolve(actions, into: &work, inline: &inlineBatch, pickup: &pickup)
        } else if onWorker {
            resolve(actions, into: &work, pickup: &pickup)
        } else {
            resolve(actions, into: &work)
        }
    }

    /// `finishRunning`'s default for the callers of a shared transfer that
    /// ended before a response (the transport could not start): they end
    /// the same way.
    static func endCallersAlike(_ callers: [Operation], _ result: OperationResult) {
        for caller in callers {
            caller.engine.finishRunning(caller, OperationResult(id: caller.id, outcome: result.outcome,
                                                                status: result.status, message: result.message,
                                                                value: nil))
        }
    }

    static func waitedTooLong(_ id: OpID) -> String { "operation \(id) waited in its queue longer than its max_wait_ms" }

    func expireDeadlines() -> UInt64? {
        lockEngine()
        let actions = machine.expire(now: monotonicNanos(), waitedMessage: Self.waitedTooLong)
        let work = resolve(actions)
        let next = machine.nextDeadline()  // includes any rate-limit wake-up
        unlockEngine()
        // The timer is the caller: it re-arms itself with `next`, no kick.
        execute(work.filter { if case .kickTimer = $0 { false } else { true } })
        return next
    }

    // MARK: - Waiting

    /// Waits until every operation of `queue` (nil: of the engine) has ended
    /// and its callback returned. In poll mode, runs callbacks meanwhile.
    func wait(queue: QueueID?, timeoutMs: Int) -> FQStatus {
        guard !onOwnThread else { return .state }
        let until = deadline(afterMs: timeoutMs)
        if delivery.mode == .poll {
            return pollUntil(until) {
                bookInbox()
                return outstanding.count(queue) == 0
            } ?? .ok
        }
        bookInbox()
        while true {
            guard outstanding.waitForZero(queue, until: until) else { return .timeout }
            // The last callback may have submitted before it returned, into
            // the inbox of a thread holding the engine lock that has not
            // booked (counted) it yet: taking the lock waits for that
            // booking, or books it.
            bookInbox()
            if outstanding.count(queue) == 0 { return .ok }
        }
    }

    /// Waits until operation `id` has ended and its callback returned
    /// (`fq_wait`). Callbacks run in the order their items were queued, and
    /// an operation's completion is queued under the engine lock when it
    /// ends: so once the lock shows it ended, its callback has returned when
    /// the delivered items reach what was queued then. While it has not
    /// ended, each delivered batch (its own included) makes the wait look
    /// again. In poll mode, runs callbacks meanwhile.
    public func wait(for id: OpID, timeoutMs: Int) throws(FetchQError) -> FQStatus {
        guard !onOwnThread else {
            throw FetchQError(.state, "fq_wait cannot be called from a callback or an operation body of its engine")
        }
        let until = deadline(afterMs: timeoutMs)
        var first = true
        while true {
            lockEngine()
            let state = machine.reportedState(of: id)
            let numbered = machine.completionSeq(of: id)
            let posted = completionsPosted
            // Read with the lock held: a live operation's completion is not
            // posted meanwhile, so it is after `seen`.
            let seen = outstanding.delivered
            unlockEngine()
            // The number of its completion once it ended; nil while it runs.
            let target: UInt64?
            if let state {
                target = state.rawValue >= OperationState.succeeded.rawValue ? (numbered ?? posted) : nil
            } else if first {
                throw Self.unknown(id)
            } else {
                target = posted  // it ended, and history let it go since: before `posted`
            }
            first = false
            if delivery.mode == .poll {
                if let status = pollUntil(until, checkFirst: true, {
                    target.map { self.outstanding.delivered >= $0 } ?? (self.outstanding.delivered > seen)
                }) {
                    return status
                }
            } else if !outstanding.waitForDelivered(target ?? seen, atLeast: target != nil, until: until) {
                return .timeout
            }
            if target != nil { return .ok }
        }
    }

    /// Poll mode: runs waiting callbacks on this thread until `done()` holds
    /// (nil) or `until` passed (`.timeout`). Not behind another thread's
    /// callbacks, which could outlast the timeout: that thread runs what
    /// waits, this one looks again.
    /// With `checkFirst`, returns at once when `done()` already holds,
    /// without running what waits.
    private func pollUntil(_ until: UInt64?, checkFirst: Bool = false, _ done: () -> Bool) -> FQStatus? {
        if checkFirst && done() { return nil }
        while true {
            let ran = delivery.dispatch(max: 0, waitForOthers: false)
            if done() { return nil }
            let now = monotonicNanos()
            if let until, now >= until { return .timeout }
            let sliceMs = until.map { Int(min(($0 - now) / 1_000_000 + 1, 100)) } ?? 100
            if ran == nil {
                usleep(1000)  // the event fd stays readable while the other thread runs them
                continue
            }
            var fd = pollfd(fd: delivery.eventFD, events: Int16(POLLIN), revents: 0)
            _ = poll(&fd, 1, Int32(sliceMs))
        }
    }

    /// Books the submits waiting in the inbox (a wait counts only booked
    /// operations: those whose submit returned before it are).
    func bookInbox() {
        lockEngine()
        unlockEngine()
    }

    public func waitIdle(timeoutMs: Int) -> FQStatus { wait(queue: nil, timeoutMs: timeoutMs) }

    // MARK: - Poll mode

    public var eventFD: Int32 { delivery.eventFD }
    public var deliveryMode: DeliveryMode { delivery.mode }

    public func dispatch(max: Int) throws(FetchQError) -> Int {
        guard delivery.mode == .poll else {
            throw FetchQError(.state, "fq_engine_dispatch needs config \"delivery\": \"poll\"")
        }
        guard !onOwnThread else {
            throw FetchQError(.state, "fq_engine_dispatch cannot be called from a callback or an operation body")
        }
        return delivery.dispatch(max: max)!  // waits for another dispatching thread: never nil
    }


    // MARK: - Shutdown

    /// Cancels pending work, waits for running operations, delivers every
    /// callback, stops the threads. `.state` from the engine's own threads.
    public func shutdown() -> FQStatus {
        guard !onOwnThread else { return .state }
        inbox.refuseAll()  // submits fail from here; those before are booked, then cancelled
        lockEngine()
        if shuttingDown {
            unlockEngine()
            return .state
        }
        shuttingDown = true
        shutdownStarted.store(true, ordering: .releasing)
        let unfinished = machine.liveCount
        let work = resolve(machine.cancelAll(now: monotonicNanos()).actions)
        unlockEngine()
        logger.info("engine shutting down", metadata: ["unfinished": "\(unfinished)"])
        execute(work)
        _ = wait(queue: nil, timeoutMs: -1)
        for transport in lock.withLock({ transports }) { transport.shutdown() }
        timer.stop()
        workers.stop()
        delivery.stop()
        lock.withLock { queues.removeAll() }
        return .ok
    }
}
