import CFetchQSupport
import CJansson
import Glibc
import Logging

/// The runtime: executes the scheduler state machine's decisions on worker
/// threads, the delivery thread (or the poll-mode caller) and a timer thread.
/// The state machine decides; this class only carries out its actions.
///
/// `@unchecked Sendable`: `machine`, `live`, `queues`, `outstanding*` and
/// `shuttingDown` are guarded by `lock`; `workers`, `delivery` and `timer`
/// are set once in init and are thread-safe themselves.
public final class Engine: @unchecked Sendable {
    typealias Machine = SchedulerStateMachine<OperationResult>

    public let config: EngineConfig
    /// The engine's logger (swift-log), at config "log"'s level.
    public let logger: Logger
    let logSink = LogSink()
    private let lock = ConditionLock()
    private var machine: Machine
    private var live: [OpID: Operation] = [:]
    private var queues: [QueueID: Queue] = [:]
    /// Operations submitted whose callback has not returned yet.
    private var outstanding: [QueueID: Int] = [:]
    private var outstandingTotal = 0
    private var shuttingDown = false
    private var eventHandler: EventHandler?
    /// Item stores used by searches, kept open (ItemStore.shared holds them weakly).
    private var stores: [String: ItemStore] = [:]
    /// In-flight shared transfers by request key.
    private var coalesced: [String: SharedTransfer] = [:]
    /// The HTTP cache (config "cache"), nil when its size is 0.
    public let httpCache: HTTPCache?
    /// Created with the first network operation.
    private var transport: CurlTransport?
    private var workers: WorkerPool!
    private var delivery: Delivery!
    private var timer: DeadlineTimer!

    public init(config: EngineConfig) throws(FetchQError) {
        self.config = config
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
            rateLimits: config.rateLimits.mapValues { .init(perSecond: $0.perSecond, burst: $0.burst) }))
        let owner = selfPointer
        delivery = try Delivery(mode: config.delivery, owner: owner) { [unowned self] item in
            delivered(item)
        }
        workers = WorkerPool(count: config.workers, owner: owner)
        timer = DeadlineTimer { [unowned self] in expireDeadlines() }
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
        lock.lock()
        defer { lock.unlock() }
        guard !shuttingDown else { throw FetchQError(.shutdown, "the engine is being freed") }
        guard machine.queueNamed(name) == nil else {
            throw FetchQError(.invalid, "a queue named \"\(name)\" already exists")
        }
        let id = machine.addQueue(name: name, maxConcurrent: maxConcurrent)
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
            queues[queue] = nil
            return m.closeQueue(queue, now: monotonicNanos())
        }
    }

    // MARK: - Submitting

    /// Submits an operation. Throws (and never calls `completion`) when the
    /// options are invalid, a dependency is unknown, or the engine is
    /// shutting down; otherwise `completion` is called exactly once.
    public func submit(_ body: OperationBody, to queue: Queue, options: UnsafePointer<json_t>?,
                       completion: Completion?) throws(FetchQError) -> OpID {
        var reader = try OptionReader(options, context: "options")
        let common = try CommonOptions(reading: &reader, config: config)
        try reader.finish()
        return try enqueue(body, queue: queue.id, common: common, host: nil, completion: completion)
    }

    /// Submits an HTTP request (`request`: method, url, headers, query, body).
    public func submitRequest(_ request: UnsafePointer<json_t>?, to queue: Queue, options: UnsafePointer<json_t>?,
                              completion: Completion?) throws(FetchQError) -> OpID {
        var reader = try OptionReader(options, context: "options")
        let common = try CommonOptions(reading: &reader, config: config)
        let job = try NetworkJob.makeRequest(request, options: &reader, config: config)
        try reader.finish()
        return try enqueueNetwork(job, queue: queue.id, common: common, completion: completion)
    }

    /// Submits a search: `query` goes into the endpoint's URL template; the
    /// value is {"query", "items", "count"}.
    public func submitSearch(_ query: String, to queue: Queue, options: UnsafePointer<json_t>?,
                             completion: Completion?) throws(FetchQError) -> OpID {
        var reader = try OptionReader(options, context: "options")
        let common = try CommonOptions(reading: &reader, config: config)
        let job = try NetworkJob.makeSearch(query, options: &reader, config: config, openStore: store(path:))
        try reader.finish()
        return try enqueueNetwork(job, queue: queue.id, common: common, completion: completion)
    }

    /// Submits a fan-out search: one child search per distinct query (each a
    /// normal operation of `queue`, honouring its limits and priorities) and a
    /// parent that collects them and completes once with the merged,
    /// de-duplicated, sorted items. Cancelling the parent cancels the children.
    public func submitSearchAll(_ queries: [String], to queue: Queue, options: UnsafePointer<json_t>?,
                                completion: Completion?) throws(FetchQError) -> OpID {
        var reader = try OptionReader(options, context: "options")
        let common = try CommonOptions(reading: &reader, config: config)
        let failFast = try reader.bool("fail_fast") ?? false
        let childEvents = try reader.bool("child_events") ?? false
        let template = try SearchTemplate(reading: &reader, config: config, openStore: store(path:))
        try reader.finish()
        guard !common.barrier else { throw FetchQError(.invalid, "options.barrier: not supported for search-all") }
        var unique: [String] = []
        for q in queries where !unique.contains(q) { unique.append(q) }
        guard !unique.isEmpty else { throw FetchQError(.invalid, "search-all needs at least one query") }
        var jobs: [NetworkJob] = []
        for q in unique { jobs.append(try template.job(for: q)) }
        let family = SearchAllFamily(template: template, failFast: failFast, childEvents: childEvents)

        let now = monotonicNanos()
        func spec(host: String?) -> Machine.Spec {
            var s = Machine.Spec(queue: queue.id)
            s.priority = common.priority
            s.qos = common.qos
            s.group = common.group
            s.host = host
            s.dependsOn = common.dependsOn
            if common.maxWaitMs > 0 { s.startDeadline = now + UInt64(common.maxWaitMs) * 1_000_000 }
            return s
        }
        lock.lock()
        guard !shuttingDown else {
            lock.unlock()
            throw FetchQError(.shutdown, "the engine is being freed")
        }
        var actions: [Machine.Action] = []
        for (q, job) in zip(unique, jobs) {
            switch machine.submit(spec(host: job.host), now: now) {
            case .success(let (id, more)):
                let child = Operation(id: id, queue: queue.id, qos: common.qos, body: .network(job), completion: nil, engine: self)
                child.family = family
                live[id] = child
                family.children.append(id)
                family.queries[id] = q
                actions += more
            case .failure(let error):
                // Only the first child can fail (they share queue and deps).
                lock.unlock()
                throw error
            }
        }
        var parentSpec = spec(host: nil)
        parentSpec.dependsOn = []
        parentSpec.startDeadline = nil
        parentSpec.collects = family.children
        guard case .success(let (parentID, more)) = machine.submit(parentSpec, now: now) else {
            fatalError("submitting a search-all parent over live children cannot fail")
        }
        let parent = Operation(id: parentID, queue: queue.id, qos: common.qos,
                               body: .block { op in family.merge(op) }, completion: completion, engine: self)
        parent.family = family
        family.parent = parentID
        live[parentID] = parent
        outstanding[queue.id, default: 0] += family.children.count + 1
        outstandingTotal += family.children.count + 1
        let work = resolve(actions + more)
        lock.unlock()
        execute(work)
        if common.maxWaitMs > 0 { timer.kick() }
        return parentID
    }

    /// The item store at `path`, opened once and kept for the engine's life.
    func store(path: String) throws(FetchQError) -> ItemStore {
        let store = try ItemStore.shared(path: path)
        lock.withLock { stores[store.path] = store }
        return store
    }

    /// A network operation: coalesced with an identical in-flight GET when
    /// it can be (no dependencies, no barrier), else queued on its own.
    private func enqueueNetwork(_ job: NetworkJob, queue: QueueID, common: CommonOptions,
                                completion: Completion?) throws(FetchQError) -> OpID {
        guard let key = job.coalesceKey, common.dependsOn.isEmpty, !common.barrier else {
            return try enqueue(.network(job), queue: queue, common: common, host: job.host, completion: completion)
        }
        let now = monotonicNanos()
        lock.lock()
        guard !shuttingDown else {
            lock.unlock()
            throw FetchQError(.shutdown, "the engine is being freed")
        }
        var actions: [Machine.Action] = []
        let shared: SharedTransfer
        if let existing = coalesced[key] {
            shared = existing
        } else {
            // The carrier: internal, in this queue, with this caller's limits.
            shared = SharedTransfer(key: key, priority: common.priority)
            var spec = Machine.Spec(queue: queue)
            spec.priority = common.priority
            spec.qos = common.qos
            spec.host = job.host
            spec.isInternal = true
            if common.maxWaitMs > 0 { spec.startDeadline = now + UInt64(common.maxWaitMs) * 1_000_000 }
            switch machine.submit(spec, now: now) {
            case .success(let (id, more)):
                let carrier = Operation(id: id, queue: queue, qos: common.qos, body: .network(job), completion: nil, engine: self)
                carrier.carries = shared
                live[id] = carrier
                shared.carrier = id
                coalesced[key] = shared
                actions += more
            case .failure(let error):
                lock.unlock()
                throw error
            }
        }
        var spec = Machine.Spec(queue: queue)
        spec.priority = common.priority
        spec.qos = common.qos
        spec.group = common.group
        spec.attached = true
        guard case .success(let (id, more)) = machine.submit(spec, now: now) else {
            lock.unlock()
            throw FetchQError(.invalid, "the queue has been freed")
        }
        let caller = Operation(id: id, queue: queue, qos: common.qos, body: .network(job), completion: completion, engine: self)
        caller.shared = shared
        shared.callers.append(caller)
        live[id] = caller
        outstanding[queue, default: 0] += 1
        outstandingTotal += 1
        actions += more
        if common.priority.rawValue > shared.priority.rawValue {
            shared.priority = common.priority
            if case .success(let more) = machine.setPriority(shared.carrier, common.priority, now: now) { actions += more }
        }
        let work = resolve(actions)
        lock.unlock()
        execute(work)
        if common.maxWaitMs > 0 { timer.kick() }
        return id
    }

    /// Receives progress events of operations submitted with "progress".
    public func setEventHandler(_ handler: EventHandler?) {
        lock.withLock { eventHandler = handler }
    }

    func enqueue(_ body: OperationBody, queue: QueueID, common: CommonOptions, host: String?,
                 completion: Completion?) throws(FetchQError) -> OpID {
        let now = monotonicNanos()
        var spec = Machine.Spec(queue: queue)
        spec.priority = common.priority
        spec.qos = common.qos
        spec.group = common.group
        spec.host = host
        spec.dependsOn = common.dependsOn
        spec.barrier = common.barrier
        if common.maxWaitMs > 0 { spec.startDeadline = now + UInt64(common.maxWaitMs) * 1_000_000 }

        lock.lock()
        guard !shuttingDown else {
            lock.unlock()
            throw FetchQError(.shutdown, "the engine is being freed")
        }
        let submitted = machine.submit(spec, now: now)
        guard case .success(let (id, actions)) = submitted else {
            lock.unlock()
            if case .failure(let error) = submitted { throw error }
            fatalError("unreachable")
        }
        live[id] = Operation(id: id, queue: queue, qos: common.qos, body: body, completion: completion, engine: self)
        outstanding[queue, default: 0] += 1
        outstandingTotal += 1
        let work = resolve(actions)
        lock.unlock()
        execute(work)
        if spec.startDeadline != nil { timer.kick() }
        return id
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
            var result = m.setPriority(id, priority, now: now)
            // A coalesced caller lifts its shared transfer to its priority.
            if case .success(var actions) = result, let shared = live[id]?.shared, !shared.done,
               priority.rawValue > shared.priority.rawValue {
                shared.priority = priority
                if case .success(let more) = m.setPriority(shared.carrier, priority, now: now) { actions += more }
                result = .success(actions)
            }
            return result
        }
    }

    public func addDependency(_ id: OpID, on dep: OpID) throws(FetchQError) {
        try runThrowing { $0.addDependency(id, on: dep, now: monotonicNanos()) }
    }

    // MARK: - Carrying out the state machine's actions

    private enum Work {
        case start(Operation)
        case deliver(Delivery.Item)
        case abort(CurlTransport, TransferID)
        /// Something is due later (a rate-limit token): re-arm the timer.
        case kickTimer
    }

    /// Applies an event to the state machine under the lock, then carries out
    /// the resulting actions outside it.
    private func run(_ event: (inout Machine) -> [Machine.Action]) {
        lock.lock()
        let work = resolve(event(&machine))
        lock.unlock()
        execute(work)
    }

    private func runThrowing(_ event: (inout Machine) -> Result<[Machine.Action], FetchQError>) throws(FetchQError) {
        lock.lock()
        switch event(&machine) {
        case .success(let actions):
            let work = resolve(actions)
            lock.unlock()
            execute(work)
        case .failure(let error):
            lock.unlock()
            throw error
        }
    }

    /// Turns actions into work on operation objects. Called with the lock held.
    private func resolve(_ actions: [Machine.Action]) -> [Work] {
        var work: [Work] = []
        resolve(actions, into: &work)
        return work
    }

    private func resolve(_ actions: [Machine.Action], into work: inout [Work]) {
        var actions = actions
        var next = 0
        while next < actions.count {
            let action = actions[next]
            next += 1
            switch action {
            case .start(let id, let dependencies):
                guard let op = live[id] else { continue }
                op.dependencies = dependencies
                work.append(.start(op))
            case .complete(let id, let outcome, let status, let message):
                guard let op = live.removeValue(forKey: id) else { continue }
                if let shared = op.carries {
                    // A carrier that never ran (cancelled, waited too long):
                    // its callers end the same way.
                    shared.done = true
                    if coalesced[shared.key] === shared { coalesced[shared.key] = nil }
                    for caller in shared.callers {
                        actions += endAttached(caller, outcome, status, message, &work)
                    }
                    continue
                }
                let result = OperationResult(id: id, outcome: outcome, status: status, message: message, value: nil)
                work.append(.deliver(.completion(result, op.completion, op.queue)))
                actions += familyEnded(op, result, &work)
            case .cancelRunning(let id):
                guard let op = live[id] else { continue }
                op.markCancelled()
                if let shared = op.shared {
                    // A coalesced caller detaches; the last one out cancels the transfer.
                    shared.callers.removeAll { $0 === op }
                    actions += endAttached(op, .cancelled, .cancelled, "operation \(id) was cancelled", &work)
                    if shared.callers.isEmpty && !shared.done {
                        if coalesced[shared.key] === shared { coalesced[shared.key] = nil }
                        if case .success(let more) = machine.cancel(shared.carrier, now: monotonicNanos()) { actions += more }
                    }
                    continue
                }
                if let transfer = op.transfer, let transport { work.append(.abort(transport, transfer)) }
            }
        }
        if machine.waitsForTokens { work.append(.kickTimer) }
    }

    /// With the lock held: ends a coalesced caller that has not got its result.
    private func endAttached(_ caller: Operation, _ outcome: Outcome, _ status: FQStatus, _ message: String,
                             _ work: inout [Work]) -> [Machine.Action] {
        guard machine.state(of: caller.id) == .attached else { return [] }
        let result = OperationResult(id: caller.id, outcome: outcome, status: status, message: message, value: nil)
        live[caller.id] = nil
        work.append(.deliver(.completion(result, caller.completion, caller.queue)))
        return machine.finished(caller.id, outcome, payload: result, now: monotonicNanos())
    }

    /// With the lock held, when an operation of a search-all family ended:
    /// the child event, and the cancellations the family implies (a cancelled
    /// parent cancels its children; with fail_fast a failed child cancels its
    /// siblings). Returns the actions of those cancellations.
    private func familyEnded(_ op: Operation, _ result: OperationResult, _ work: inout [Work]) -> [Machine.Action] {
        guard let family = op.family else { return [] }
        var cancels: [OpID] = []
        if op.id == family.parent {
            family.parentEnded = true
            if result.outcome == .cancelled { cancels = family.children }
        } else {
            if family.childEvents && !family.parentEnded, let handler = eventHandler {
                let event = OperationEvent(id: family.parent, kind: .child, child: result, query: family.queries[op.id])
                work.append(.deliver(.event(event, handler)))
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

    private func execute(_ work: [Work]) {
        for item in work {
            switch item {
            case .start(let op): start(op)
            case .deliver(let item): delivery.post(item)
            case .abort(let transport, let transfer): transport.cancel(transfer)
            case .kickTimer: timer.kick()
            }
        }
    }

    private func start(_ op: Operation) {
        switch op.body {
        case .block(let body):
            workers.submit(qos: op.qos) { [self] in
                let value = body(op)
                if op.claimFinish() { bodyEnded(op, value: value, error: op.errorMessage) }
            }
        case .async(let body):
            workers.submit(qos: op.qos) { body(op) }
        case .network(let job):
            startTransfer(op, job)
        }
    }

    /// What the HTTP cache contributed to a transfer.
    struct CacheContext: Sendable {
        var key: String
        var requestCacheControl: String?
        /// The entry being revalidated (conditional headers were sent).
        var entry: HTTPCache.Entry?
    }

    private func startTransfer(_ op: Operation, _ job: NetworkJob) {
        var job = job
        var cacheContext: CacheContext? = nil
        if let cache = httpCache, let key = job.cacheKey, lock.withLock({ op.attempts }) == 0 {
            let control = job.request.headers.first { $0.name.lowercased() == "cache-control" }?.value
            var context = CacheContext(key: key, requestCacheControl: control)
            let found: HTTPCache.Lookup = job.cache == .reload ? .miss : cache.lookup(key, now: wallClockSeconds(), requestCacheControl: control)
            switch (job.cache, found) {
            case (.default, .fresh(let entry)), (.onlyIfCached, .fresh(let entry)), (.onlyIfCached, .stale(let entry)):
                lock.withLock {
                    op.startedAt = monotonicNanos()
                    op.attempts = 1
                }
                let response = entry.response(url: job.request.url)
                workers.submit(qos: op.qos) { [self, job] in transferEnded(op, job, .success(response), cache: nil, fromCache: true) }
                return
            case (.onlyIfCached, .miss):
                finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .cacheMiss,
                                                  message: "GET \(job.request.url): not in the cache (cache: only-if-cached)", value: nil))
                return
            case (.staleWhileRevalidate, .fresh(let entry)), (.staleWhileRevalidate, .stale(let entry)):
                if let handler = lock.withLock({ eventHandler }) {
                    let cached = job.result(id: op.id, .success(entry.response(url: job.request.url)), queueWaitMs: 0,
                                            attempts: 0, cancelled: false, fromCache: true)
                    delivery.post(.event(OperationEvent(id: op.id, kind: .update, child: cached), handler))
                }
                fallthrough
            case (.default, .stale(let entry)):
                job.request.headers += HTTPCache.conditionalHeaders(for: entry)
                context.entry = entry
            default:
                break
            }
            cacheContext = context
        }
        lock.lock()
        if op.startedAt == 0 { op.startedAt = monotonicNanos() }
        op.attempts += 1
        if transport == nil {
            do {
                transport = try CurlTransport()
            } catch {
                lock.unlock()
                finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .network,
                                                  message: "cannot start the transport: \(error.message)", value: nil))
                return
            }
        }
        let transport = transport!
        lock.unlock()
        var progress: (@Sendable (UInt64, UInt64) -> Void)? = nil
        if job.progressIntervalMs != nil {
            progress = { [unowned self] received, expected in
                let (handler, ids) = lock.withLock { (eventHandler, op.carries.map { $0.callers.map(\.id) } ?? [op.id]) }
                guard let handler else { return }
                for id in ids {
                    delivery.post(.event(OperationEvent(id: id, kind: .progress, received: received, expected: expected), handler))
                }
            }
        }
        let transfer = transport.start(job.request, progress: progress) { [unowned self, job, cacheContext] outcome in
            // The loop thread only hands over: parsing runs on a worker.
            workers.submit(qos: op.qos) { [self, job, cacheContext] in transferEnded(op, job, outcome, cache: cacheContext) }
        }
        // A cancel that arrived before the transfer id was known aborts it now.
        let cancelledMeanwhile = lock.withLock {
            op.transfer = transfer
            return op.isCancelled
        }
        if cancelledMeanwhile { transport.cancel(transfer) }
    }

    /// A transfer ended: retry it, or turn it into the result(s).
    private func transferEnded(_ op: Operation, _ job: NetworkJob, _ outcome: Result<HTTPResponse, TransportError>,
                               cache context: CacheContext?, fromCache: Bool = false) {
        var outcome = outcome
        var fromCache = fromCache
        if let context, let cache = httpCache, case .success(let response) = outcome {
            let now = wallClockSeconds()
            if response.status == 304, context.entry != nil,
               let refreshed = cache.refresh(context.key, notModifiedHeaders: response.headers, now: now) {
                // Revalidated: the cached body, with this transfer's metrics.
                var revalidated = refreshed.response(url: job.request.url)
                revalidated.metrics = response.metrics
                outcome = .success(revalidated)
                fromCache = true
            } else {
                cache.store(context.key, status: response.status, headers: response.headers, body: response.body,
                            requestCacheControl: context.requestCacheControl, now: now)
            }
        }
        let attempts = lock.withLock { op.attempts }
        if !op.isCancelled,
           let delay = job.retry.delay(after: outcome, attempt: attempts, method: job.request.method, now: wallClockSeconds()) {
            lock.lock()
            if machine.state(of: op.id) == .running && !op.isCancelled {
                logger.info("retrying", metadata: ["id": "\(op.id)", "attempt": "\(attempts + 1)", "delay_s": "\(delay)"])
                op.transfer = nil
                let now = monotonicNanos()
                let work = resolve(machine.retryLater(op.id, until: now + UInt64(delay * 1e9), now: now))
                lock.unlock()
                execute(work)
                timer.kick()
                return
            }
            lock.unlock()
        }
        guard let shared = op.carries else {
            let queueWaitMs = Double(op.startedAt - op.submittedAt) / 1e6
            var result = job.result(id: op.id, outcome, queueWaitMs: queueWaitMs, attempts: attempts,
                                    cancelled: op.isCancelled, fromCache: fromCache)
            if result.outcome == .failed, job.cache == .staleWhileRevalidate, let stale = context?.entry {
                // The refresh failed: the stale value stays readable.
                let cached = job.result(id: op.id, .success(stale.response(url: job.request.url)), queueWaitMs: queueWaitMs,
                                        attempts: attempts, cancelled: false, fromCache: true)
                result = OperationResult(id: op.id, outcome: .failed, status: result.status,
                                         message: (result.message ?? "") + " (the stale cached value is kept as the value)",
                                         value: cached.value, http: result.http)
            }
            finishRunning(op, result)
            return
        }
        // A shared transfer: every caller still attached gets its own result.
        let callers: [Operation] = lock.withLock {
            shared.done = true
            if coalesced[shared.key] === shared { coalesced[shared.key] = nil }
            return shared.callers
        }
        for caller in callers {
            guard case .network(let callerJob) = caller.body else { continue }
            let queueWaitMs = Double(op.startedAt > caller.submittedAt ? op.startedAt - caller.submittedAt : 0) / 1e6
            workers.submit(qos: caller.qos) { [self, outcome, fromCache] in
                finishRunning(caller, callerJob.result(id: caller.id, outcome, queueWaitMs: queueWaitMs, attempts: attempts,
                                                       cancelled: caller.isCancelled, fromCache: fromCache))
            }
        }
        let ok = (try? outcome.get()) != nil
        finishRunning(op, OperationResult(id: op.id, outcome: op.isCancelled ? .cancelled : ok ? .succeeded : .failed,
                                          status: op.isCancelled ? .cancelled : ok ? .ok : .network, message: nil, value: nil))
    }

    /// A running operation's body ended (block returned, async finished).
    func bodyEnded(_ op: Operation, value: JSONRef?, error: String?) {
        let result: OperationResult
        if op.isCancelled {
            result = OperationResult(id: op.id, outcome: .cancelled, status: .cancelled,
                                     message: "operation \(op.id) was cancelled", value: nil)
        } else if let error {
            result = OperationResult(id: op.id, outcome: .failed, status: op.errorStatus, message: error, value: nil)
        } else {
            result = OperationResult(id: op.id, outcome: .succeeded, status: .ok, message: nil, value: value)
        }
        finishRunning(op, result)
    }

    /// Books a running operation's result and delivers it.
    func finishRunning(_ op: Operation, _ result: OperationResult) {
        lock.lock()
        let state = machine.state(of: op.id)
        guard state == .running || state == .attached else {
            lock.unlock()
            return
        }
        // A cancel is applied under this lock: if one got in before the end
        // was booked, the operation ends cancelled, so that a cancel that
        // returned FQ_OK always means FQ_CANCELLED.
        var result = result
        if op.isCancelled && result.outcome != .cancelled {
            result = OperationResult(id: op.id, outcome: .cancelled, status: .cancelled,
                                     message: "operation \(op.id) was cancelled", value: nil, http: result.http)
        }
        let actions = machine.finished(op.id, result.outcome, payload: result, now: monotonicNanos())
        live[op.id] = nil
        var work: [Work] = []
        let familyActions = familyEnded(op, result, &work)  // its event goes before what it unblocks
        resolve(familyActions + actions, into: &work)
        lock.unlock()
        if op.carries == nil {  // a carrier is internal: nobody waits for its callback
            delivery.post(.completion(result, op.completion, op.queue))
        }
        if result.outcome == .failed {
            logger.info("operation failed", metadata: ["id": "\(op.id)", "status": "\(result.status)", "error": "\(result.message ?? "")"])
        }
        execute(work)
    }

    /// After a callback returned.
    private func delivered(_ item: Delivery.Item) {
        guard case .completion(_, _, let queue) = item else { return }
        lock.lock()
        let left = outstanding[queue, default: 1] - 1
        outstanding[queue] = left == 0 ? nil : left
        outstandingTotal -= 1
        let wake = left == 0 || outstandingTotal == 0
        lock.unlock()
        if wake { lock.broadcast() }
    }

    private func expireDeadlines() -> UInt64? {
        lock.lock()
        let actions = machine.expire(now: monotonicNanos()) { id in
            "operation \(id) waited in its queue longer than its max_wait_ms"
        }
        let work = resolve(actions)
        let next = machine.nextDeadline()  // includes any rate-limit wake-up
        lock.unlock()
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
        let pending = { [self] in queue.map { outstanding[$0] ?? 0 } ?? outstandingTotal }
        if delivery.mode == .poll {
            while true {
                _ = delivery.dispatch(max: 0)
                if lock.withLock(pending) == 0 { return .ok }
                let now = monotonicNanos()
                if let until, now >= until { return .timeout }
                let sliceMs = until.map { Int(min(($0 - now) / 1_000_000 + 1, 100)) } ?? 100
                var fd = pollfd(fd: delivery.eventFD, events: Int16(POLLIN), revents: 0)
                _ = poll(&fd, 1, Int32(sliceMs))
            }
        }
        lock.lock()
        defer { lock.unlock() }
        while pending() > 0 {
            if !lock.wait(until: until) && pending() > 0 { return .timeout }
        }
        return .ok
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
        return delivery.dispatch(max: max)
    }

    // MARK: - Stats

    /// Counters as a new JSON object (see fq_engine_stats).
    public func stats() -> JSONRef {
        lock.lock()
        defer { lock.unlock() }
        let root = json_object()!
        func put(_ object: UnsafeMutablePointer<json_t>, _ key: String, _ value: Int) {
            json_object_set_new(object, key, json_integer(json_int_t(value)))
        }
        func counters(_ object: UnsafeMutablePointer<json_t>, _ c: Machine.Counters) {
            put(object, "submitted", c.submitted)
            put(object, "succeeded", c.succeeded)
            put(object, "failed", c.failed)
            put(object, "cancelled", c.cancelled)
            put(object, "queued", c.queued)
            put(object, "running", c.running)
        }
        counters(root, machine.counters)
        put(root, "undelivered", outstandingTotal - machine.counters.queued - machine.counters.running)
        let perQueue = json_object()!
        for (id, queue) in machine.queues where !queue.closed {
            let q = json_object()!
            counters(q, queue.counters)
            put(q, "max_concurrent", queue.maxConcurrent)
            json_object_set_new(q, "suspended", queue.suspended ? json_true() : json_false())
            _ = id
            json_object_set_new(perQueue, queue.name, q)
        }
        json_object_set_new(root, "queues", perQueue)
        if let cache = httpCache {
            let s = cache.statistics
            let c = json_object()!
            put(c, "entries", s.entries)
            put(c, "bytes", s.bytes)
            put(c, "hits", s.hits)
            put(c, "misses", s.misses)
            put(c, "evictions", s.evictions)
            json_object_set_new(root, "cache", c)
        }
        return JSONRef(owned: root)!
    }

    // MARK: - Shutdown

    /// Cancels pending work, waits for running operations, delivers every
    /// callback, stops the threads. `.state` from the engine's own threads.
    public func shutdown() -> FQStatus {
        guard !onOwnThread else { return .state }
        lock.lock()
        if shuttingDown {
            lock.unlock()
            return .state
        }
        shuttingDown = true
        logger.info("engine shutting down", metadata: ["unfinished": "\(machine.liveCount)"])
        let work = resolve(machine.cancelAll(now: monotonicNanos()).actions)
        lock.unlock()
        execute(work)
        _ = wait(queue: nil, timeoutMs: -1)
        lock.withLock { transport }?.shutdown()
        timer.stop()
        workers.stop()
        delivery.stop()
        lock.withLock { queues.removeAll() }
        return .ok
    }
}

/// The options every submit accepts (include/fetchq.h, "Options common to
/// every submit").
struct CommonOptions {
    var priority = Priority.normal
    var qos = QoS.default
    var group: String? = nil
    var dependsOn: [OpID] = []
    var barrier = false
    var maxWaitMs = 0

    init(reading r: inout OptionReader, config: EngineConfig) throws(FetchQError) {
        maxWaitMs = config.network.maxWaitMs
        if let v = r.value("priority") {
            switch v.pointee.type {
            case JSON_INTEGER:
                guard let p = Priority(rawValue: Int(json_integer_value(v))) else {
                    throw FetchQError(.invalid, "\(r.path("priority")): \(json_integer_value(v)) is not one of -8, -4, 0, 4, 8")
                }
                priority = p
            case JSON_STRING:
                let name = jsonString(v)
                guard let p = Priority(name: name) else {
                    throw FetchQError(.invalid, "\(r.path("priority")): \"\(name)\" is not one of \"very-low\", \"low\", \"normal\", \"high\", \"very-high\"")
                }
                priority = p
            default:
                throw r.typeError("priority", "one of -8, -4, 0, 4, 8 or a priority name", v)
            }
        }
        if let name = try r.choice("qos", QoS.allCases.reversed().map(\.name)) { qos = QoS(name: name)! }
        if let g = try r.string("group") { group = g }
        if let v = r.value("depends_on") {
            guard v.pointee.type == JSON_ARRAY else { throw r.typeError("depends_on", "an array of operation ids", v) }
            for i in 0..<json_array_size(v) {
                let item = json_array_get(v, i)!
                guard item.pointee.type == JSON_INTEGER, json_integer_value(item) > 0 else {
                    throw FetchQError(.invalid, "\(r.path("depends_on"))[\(i)]: expected an operation id (an integer > 0)")
                }
                dependsOn.append(json_integer_value(item))
            }
        }
        if let b = try r.bool("barrier") { barrier = b }
        if let n = try r.int("max_wait_ms", in: 0...86_400_000) { maxWaitMs = n }
    }
}
