/// The scheduler's decisions, as a plain value with no threads and no I/O:
/// what may start (queue limits, suspension, per-host limits, priorities with
/// aging, QoS), what a cancel does, and what a completion unblocks. Every
/// event returns the actions the runtime must carry out. `Payload` is the
/// runtime's result object, carried along dependency edges for data passing.
///
/// Ordering rule (documented in include/fetchq.h): within a queue the next
/// operation is the ready one with the highest effective level, where
/// effective level = priority level (0...4) + one per `agingNanos` it has
/// waited since it became ready; ties go to the higher QoS, then to the
/// earlier submission (FIFO). Across queues (which compete only for hosts)
/// the same key decides, QoS first.
struct SchedulerStateMachine<Payload> {
    struct Config {
        /// A ready operation gains a level every `agingNanos` (0 = off).
        var agingNanos: UInt64 = 1_000_000_000
        /// Network operations running at once per host, across queues.
        var maxPerHost: Int = 6
        /// Finished operations remembered for depends_on.
        var history: Int = 4096
        /// Of those, how many network operations (the newest) keep their
        /// value — a parsed response can be large. Other operations' values
        /// are kept for all of `history`.
        var historyValues: Int = 256
        /// Token buckets per host key ("host:port", "host", or "*" for any).
        var rateLimits: [String: RateLimit] = [:]
    }

    /// At most `perSecond` starts per second on average, `burst` at once.
    struct RateLimit: Equatable {
        var perSecond: Double
        var burst: Double
    }

    struct Bucket {
        var limit: RateLimit
        var tokens: Double
        var refilledAt: UInt64

        mutating func refill(_ now: UInt64) {
            guard now > refilledAt else { return }
            tokens = min(limit.burst, tokens + Double(now - refilledAt) / 1e9 * limit.perSecond)
            refilledAt = now
        }

        /// When the next whole token is there.
        func nextToken() -> UInt64 {
            refilledAt &+ UInt64(max(0, (1 - tokens) / limit.perSecond * 1e9).rounded(.up))
        }
    }

    /// What the runtime must do after an event.
    enum Action {
        /// Start the operation; `dependencies` are the outcomes and payloads
        /// of its strict (all succeeded) and collect dependencies.
        case start(OpID, dependencies: [Dependency])
        /// The scheduler ended an operation that never started (cancelled,
        /// dependency failed, queue timeout): deliver its completion.
        case complete(OpID, Outcome, FQStatus, String)
        /// A running operation was cancelled: tell its body / abort its I/O.
        case cancelRunning(OpID)
    }

    /// What a submit asks for.
    struct Spec {
        var queue: QueueID
        var priority: Priority = .normal
        var qos: QoS = .default
        var group: String? = nil
        /// host:port for network operations (per-host limit), nil otherwise.
        var host: String? = nil
        var dependsOn: [OpID] = []
        /// Operations whose results this one collects (must be unfinished).
        var collects: [OpID] = []
        var barrier = false
        /// Absolute monotonic deadline for starting, nil for none.
        var startDeadline: UInt64? = nil
        /// Engine-internal work (a coalesced transfer): holds a slot but is
        /// not counted in submitted/succeeded/failed/cancelled.
        var isInternal = false
        /// Shares another operation's transfer: never takes a slot; the
        /// runtime ends it. Takes no dependencies, barrier or host.
        var attached = false
    }

    /// waiting: for dependencies; ready: for a slot; running: holds a slot;
    /// backoff: between two attempts (no slot) until its retry time;
    /// attached: sharing another operation's transfer (no slot).
    enum OpState { case waiting, ready, running, backoff, attached }

    /// A finished dependency as the dependent sees it (data passing).
    struct Dependency {
        var id: OpID
        var outcome: Outcome
        var payload: Payload?
    }

    enum Edge {
        /// depends_on: a failed or cancelled dependency cancels the dependent.
        case strict
        /// Barriers: only wait.
        case order
        /// Fan-in (search-all): wait, and receive the result whatever it is.
        case collect
    }

    struct Dependent {
        var id: OpID
        var edge: Edge
    }

    struct Op {
        var queue: QueueID
        var level: Int
        var qos: Int
        var seq: UInt64
        var group: String?
        var host: String?
        var state: OpState = .waiting
        var waitingOn = 0
        var dependents: [Dependent] = []
        /// Strict and collect dependencies, for cycle checks.
        var dependencies: [OpID] = []
        var dependencyPayloads: [Dependency] = []
        var readySince: UInt64 = 0
        var cancelRequested = false
        var isBarrier = false
        var isInternal = false
    }

    struct Counters {
        var submitted = 0
        var succeeded = 0
        var failed = 0
        var cancelled = 0
        var queued = 0
        var running = 0

        mutating func count(_ outcome: Outcome) {
            switch outcome {
            case .succeeded: succeeded += 1
            case .failed: failed += 1
            case .cancelled: cancelled += 1
            }
        }
    }

    /// Ready operations of one queue for one host: one FIFO per
    /// (priority level, QoS), so equal priorities go by QoS, then by age.
    struct Lane {
        var rings = [Ring<OpID>](repeating: Ring(), count: 25)
        static func slot(level: Int, qos: Int) -> Int { level * 5 + qos }
    }

    struct Queue {
        var name: String
        var maxConcurrent: Int
        var suspended = false
        var closed = false
        var lanes: [String: Lane] = [:]
        var readyCount = 0
        var unfinished: Set<OpID> = []
        var openBarrier: OpID? = nil
        var counters = Counters()
    }

    struct Finished {
        var outcome: Outcome
        var payload: Payload?
        /// Ended by a cancel of its own (not a failed dependency).
        var cancelled = false
    }

    private(set) var config: Config
    private(set) var ops: [OpID: Op] = [:]
    private(set) var queues: [QueueID: Queue] = [:]
    private(set) var counters = Counters()
    private var hostRunning: [String: Int] = [:]
    private var groups: [String: Set<OpID>] = [:]
    private var history: [OpID: Finished] = [:]
    private var historyOrder = Ring<OpID>()
    private var valueOrder = Ring<OpID>()
    /// Values dropped from history, to be released by the runtime after it
    /// unlocks (freeing a big parsed document must not hold the lock).
    private(set) var released: [Payload] = []
    private var deadlines = MinHeap<OpID>()
    /// Operations in backoff, by retry time.
    private var retries = MinHeap<OpID>()
    private var buckets: [String: Bucket] = [:]
    /// The earliest time a token frees an operation held back by a rate limit.
    private var rateWake: UInt64? = nil
    private var nextOpID: OpID = 1
    private var nextQueueID: QueueID = 1
    private var nextSeq: UInt64 = 0
    /// Queue ids in creation order (iterated without touching `queues`'
    /// storage, so mutating a queue never forces a copy).
    private var queueOrder: [QueueID] = []

    init(config: Config = Config()) {
        self.config = config
    }

    // MARK: - Queues

    mutating func addQueue(name: String, maxConcurrent: Int) -> QueueID {
        let id = nextQueueID
        nextQueueID += 1
        queues[id] = Queue(name: name, maxConcurrent: maxConcurrent)
        queueOrder.append(id)
        return id
    }

    func queueNamed(_ name: String) -> QueueID? {
        queues.first(where: { $0.value.name == name && !$0.value.closed })?.key
    }

    mutating func setMaxConcurrent(_ queue: QueueID, _ n: Int, now: UInt64) -> [Action] {
        guard queues[queue] != nil else { return [] }
        queues[queue]!.maxConcurrent = n
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return actions
    }

    mutating func setSuspended(_ queue: QueueID, _ suspended: Bool, now: UInt64) -> [Action] {
        guard queues[queue] != nil else { return [] }
        queues[queue]!.suspended = suspended
        var actions: [Action] = []
        if !suspended { schedule(now: now, into: &actions) }
        return actions
    }

    /// The queue's handle was freed: cancel what has not started, and forget
    /// the queue once its running operations are done.
    mutating func closeQueue(_ queue: QueueID, now: UInt64) -> [Action] {
        guard queues[queue] != nil else { return [] }
        queues[queue]!.closed = true
        let notStarted = queues[queue]!.unfinished.filter { ops[$0]?.state != .running }
        let actions = cancelMany(Array(notStarted), now: now).actions
        removeQueueIfDone(queue)
        return actions
    }

    private mutating func removeQueueIfDone(_ queue: QueueID) {
        if let q = queues[queue], q.closed, q.unfinished.isEmpty {
            queues[queue] = nil
            queueOrder.removeAll { $0 == queue }
        }
    }

    // MARK: - Submit

    /// Adds an operation. Fails (and changes nothing) for an unknown or
    /// closed queue, or an unknown dependency.
    mutating func submit(_ spec: Spec, now: UInt64) -> Result<(OpID, [Action]), FetchQError> {
        guard queues[spec.queue].map({ !$0.closed }) == true else {
            return .failure(FetchQError(.invalid, "the queue has been freed"))
        }
        var deps: [OpID] = []
        var seen = Set<OpID>()
        for dep in spec.dependsOn where seen.insert(dep).inserted {
            guard ops[dep] != nil || history[dep] != nil else {
                return .failure(FetchQError(.notFound, Self.unknownMessage(dep, nextOpID: nextOpID, history: config.history)))
            }
            deps.append(dep)
        }


        let id = nextOpID
        nextOpID += 1
        nextSeq += 1
        var op = Op(queue: spec.queue, level: spec.priority.level, qos: spec.qos.rawValue, seq: nextSeq,
                    group: spec.group, host: spec.host)
        op.isBarrier = spec.barrier
        ops[id] = op
        queues[spec.queue]!.unfinished.insert(id)
        ops[id]!.isInternal = spec.isInternal
        if !spec.isInternal {
            queues[spec.queue]!.counters.submitted += 1
            counters.submitted += 1
        }
        queues[spec.queue]!.counters.queued += 1
        counters.queued += 1
        if let group = spec.group { groups[group, default: []].insert(id) }
        if spec.attached {
            ops[id]!.state = .attached
            return .success((id, []))
        }
        if let deadline = spec.startDeadline { deadlines.insert(id, key: deadline) }

        var actions: [Action] = []
        // Ordering edges: a barrier waits for everything before it; everything
        // after an open barrier waits for the barrier.
        if spec.barrier {
            let earlier = queues[spec.queue]!.unfinished.filter { $0 != id }
            for other in earlier { link(id, after: other, edge: .order) }
            queues[spec.queue]!.openBarrier = id
        } else if let barrier = queues[spec.queue]!.openBarrier {
            link(id, after: barrier, edge: .order)
        }
        for dep in spec.collects {
            if ops[dep] != nil {
                link(id, after: dep, edge: .collect)
            } else {
                // Already ended (e.g. at its own submit, its dependency had
                // failed): collected as it ended, or as cancelled if forgotten.
                let done = history[dep]
                ops[id]!.dependencyPayloads.append(
                    Dependency(id: dep, outcome: done?.outcome ?? .cancelled, payload: done?.payload))
            }
        }
        var failedDependency: (OpID, Outcome)? = nil
        for dep in deps {
            if ops[dep] != nil {
                link(id, after: dep, edge: .strict)
            } else if let done = history[dep] {
                ops[id]!.dependencies.append(dep)
                if done.outcome == .succeeded {
                    ops[id]!.dependencyPayloads.append(Dependency(id: dep, outcome: .succeeded, payload: done.payload))
                } else if failedDependency == nil {
                    failedDependency = (dep, done.outcome)
                }
            }
        }
        if let (dep, outcome) = failedDependency {
            end(id, .cancelled, .dependency, Self.dependencyMessage(dep, outcome), now: now, into: &actions)
        } else if ops[id]!.waitingOn == 0 {
            makeReady(id, now: now)
        }
        schedule(now: now, into: &actions)
        return .success((id, actions))
    }

    private static func unknownMessage(_ dep: OpID, nextOpID: OpID, history: Int) -> String {
        if dep > 0 && dep < nextOpID {
            return "operation \(dep) finished longer ago than the engine remembers (config \"history\": \(history))"
        }
        return "no operation \(dep)"
    }

    private static func dependencyMessage(_ dep: OpID, _ outcome: Outcome) -> String {
        "dependency \(dep) \(outcome == .cancelled ? "was cancelled" : "failed")"
    }

    private mutating func link(_ id: OpID, after dep: OpID, edge: Edge) {
        ops[dep]!.dependents.append(Dependent(id: id, edge: edge))
        ops[id]!.waitingOn += 1
        if edge != .order { ops[id]!.dependencies.append(dep) }
    }

    // MARK: - Dependencies added later

    /// Makes `id` also wait for `dep` (NSOperation.addDependency).
    mutating func addDependency(_ id: OpID, on dep: OpID, now: UInt64) -> Result<[Action], FetchQError> {
        guard let op = ops[id] else {
            return .failure(FetchQError(.notFound, "no unfinished operation \(id)"))
        }
        guard op.state == .waiting || op.state == .ready else {
            return .failure(FetchQError(.state, "operation \(id) has already started"))
        }
        if dep == id {
            return .failure(FetchQError(.cycle, "operation \(id) cannot depend on itself"))
        }
        if ops[dep] != nil {
            if waits(dep, on: id) {
                return .failure(FetchQError(.cycle, "operation \(dep) already waits for \(id): the dependency would create a cycle"))
            }
            if op.dependencies.contains(dep) { return .success([]) }
            link(id, after: dep, edge: .strict)
            if op.state == .ready { unready(id) }
            return .success([])
        }
        guard let done = history[dep] else {
            return .failure(FetchQError(.notFound, Self.unknownMessage(dep, nextOpID: nextOpID, history: config.history)))
        }
        var actions: [Action] = []
        ops[id]!.dependencies.append(dep)
        if done.outcome == .succeeded {
            ops[id]!.dependencyPayloads.append(Dependency(id: dep, outcome: .succeeded, payload: done.payload))
        } else {
            end(id, .cancelled, .dependency, Self.dependencyMessage(dep, done.outcome), now: now, into: &actions)
            schedule(now: now, into: &actions)
        }
        return .success(actions)
    }

    /// Whether `start` waits, directly or through others, for `target`.
    private func waits(_ start: OpID, on target: OpID) -> Bool {
        var stack = [start]
        var seen: Set<OpID> = [start]
        while let current = stack.popLast() {
            guard let op = ops[current] else { continue }
            for dep in op.dependencies where ops[dep] != nil {
                if dep == target { return true }
                if seen.insert(dep).inserted { stack.append(dep) }
            }
        }
        return false
    }

    // MARK: - Priority

    mutating func setPriority(_ id: OpID, _ priority: Priority, now: UInt64) -> Result<[Action], FetchQError> {
        guard let op = ops[id] else {
            return .failure(FetchQError(.notFound, "no unfinished operation \(id)"))
        }
        guard op.state != .running else {
            return .failure(FetchQError(.state, "operation \(id) has already started"))
        }
        guard op.level != priority.level else { return .success([]) }
        ops[id]!.level = priority.level
        if op.state == .ready {
            // The old ring entry goes stale (its level no longer matches).
            queues[op.queue]!.lanes[op.host ?? "", default: Lane()].rings[Lane.slot(level: priority.level, qos: op.qos)].append(id)
        }
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return .success(actions)
    }

    // MARK: - Cancellation

    /// Cancels one operation. Not started: it ends now. Running: the runtime
    /// is told to abort it; it ends when the runtime reports `finished`.
    mutating func cancel(_ id: OpID, now: UInt64) -> Result<[Action], FetchQError> {
        guard ops[id] != nil else {
            // Cancelling twice is harmless, while the operation is remembered.
            if history[id]?.cancelled == true { return .success([]) }
            return .failure(FetchQError(.notFound, history[id] != nil
                ? "operation \(id) has already finished" : "no operation \(id)"))
        }
        var actions: [Action] = []
        cancelOne(id, now: now, into: &actions)
        schedule(now: now, into: &actions)
        return .success(actions)
    }

    mutating func cancelGroup(_ group: String, now: UInt64) -> (count: Int, actions: [Action]) {
        cancelMany(groups[group].map { Array($0) } ?? [], now: now)
    }

    mutating func cancelAll(now: UInt64) -> (count: Int, actions: [Action]) {
        cancelMany(Array(ops.keys), now: now)
    }

    mutating func cancelQueue(_ queue: QueueID, now: UInt64) -> (count: Int, actions: [Action]) {
        cancelMany(queues[queue].map { Array($0.unfinished) } ?? [], now: now)
    }

    private mutating func cancelMany(_ ids: [OpID], now: UInt64) -> (count: Int, actions: [Action]) {
        var actions: [Action] = []
        var count = 0
        // Highest id first: dependents are usually submitted after their
        // dependencies, so each reports its own cancellation rather than a
        // dependency failure.
        for id in ids.sorted(by: >) where ops[id] != nil && !ops[id]!.cancelRequested {
            count += 1
            cancelOne(id, now: now, into: &actions)
        }
        schedule(now: now, into: &actions)
        return (count, actions)
    }

    private mutating func cancelOne(_ id: OpID, now: UInt64, into actions: inout [Action]) {
        guard let op = ops[id], !op.cancelRequested else { return }
        if op.state == .running || op.state == .attached {
            ops[id]!.cancelRequested = true
            actions.append(.cancelRunning(id))
        } else {
            end(id, .cancelled, .cancelled, "operation \(id) was cancelled", now: now, into: &actions)
        }
    }

    // MARK: - Completion

    /// The runtime reports that a running operation ended.
    mutating func finished(_ id: OpID, _ outcome: Outcome, payload: Payload?, now: UInt64) -> [Action] {
        guard let op = ops[id], op.state == .running || op.state == .attached else { return [] }
        ops[id] = nil
        var actions: [Action] = []
        if op.state == .attached {
            queues[op.queue]!.counters.queued -= 1
            counters.queued -= 1
        } else {
            queues[op.queue]!.counters.running -= 1
            counters.running -= 1
            if let host = op.host { hostRunning[host, default: 1] -= 1 }
        }
        retire([(id, op, outcome, payload, outcome == .cancelled && op.cancelRequested)], now: now, into: &actions)
        schedule(now: now, into: &actions)
        return actions
    }

    /// Ends an operation that has not started, and everything that strictly
    /// depends on it.
    private mutating func end(_ id: OpID, _ outcome: Outcome, _ status: FQStatus, _ message: String,
                              now: UInt64, into actions: inout [Action]) {
        if let op = markEnded(id, outcome, status, message, into: &actions) {
            retire([(id, op, outcome, nil, status == .cancelled)], now: now, into: &actions)
        }
    }

    /// Removes a not-started operation, counts it and emits its completion.
    private mutating func markEnded(_ id: OpID, _ outcome: Outcome, _ status: FQStatus, _ message: String,
                                    into actions: inout [Action]) -> Op? {
        guard let op = ops[id], op.state != .running, op.state != .attached else { return nil }
        ops[id] = nil
        if op.state == .ready { queues[op.queue]!.readyCount -= 1 }
        queues[op.queue]!.counters.queued -= 1
        counters.queued -= 1
        actions.append(.complete(id, outcome, status, message))
        return op
    }

    /// Books removed operations as finished and settles their dependents.
    /// Iterative, so a long chain of failures cannot overflow the stack.
    private mutating func retire(_ first: [(OpID, Op, Outcome, Payload?, Bool)], now: UInt64,
                                 into actions: inout [Action]) {
        var pending = first
        while let (id, op, outcome, payload, byCancel) = pending.popLast() {
            queues[op.queue]!.unfinished.remove(id)
            if !op.isInternal {
                queues[op.queue]!.counters.count(outcome)
                counters.count(outcome)
            }
            if queues[op.queue]!.openBarrier == id { queues[op.queue]!.openBarrier = nil }
            if let group = op.group {
                groups[group]?.remove(id)
                if groups[group]?.isEmpty == true { groups[group] = nil }
            }
            remember(id, Finished(outcome: outcome, payload: outcome == .succeeded ? payload : nil, cancelled: byCancel),
                     large: op.host != nil)
            for dependent in op.dependents where ops[dependent.id] != nil {
                if dependent.edge == .strict && outcome != .succeeded {
                    let message = Self.dependencyMessage(id, outcome)
                    if let removed = markEnded(dependent.id, .cancelled, .dependency, message, into: &actions) {
                        pending.append((dependent.id, removed, .cancelled, nil, false))
                    }
                    continue
                }
                if dependent.edge != .order {
                    ops[dependent.id]!.dependencyPayloads.append(Dependency(id: id, outcome: outcome, payload: payload))
                }
                ops[dependent.id]!.waitingOn -= 1
                if ops[dependent.id]!.waitingOn == 0 && ops[dependent.id]!.state == .waiting {
                    makeReady(dependent.id, now: now)
                }
            }
            removeQueueIfDone(op.queue)
        }
    }

    private mutating func remember(_ id: OpID, _ finished: Finished, large: Bool) {
        guard config.history > 0 else {
            if let payload = finished.payload { released.append(payload) }
            return
        }
        var finished = finished
        if finished.payload != nil && large {
            if config.historyValues > 0 {
                valueOrder.append(id)
            } else {
                released.append(finished.payload!)
                finished.payload = nil
            }
        }
        history[id] = finished
        historyOrder.append(id)
        while valueOrder.count > config.historyValues {
            let old = valueOrder.removeFirst()
            if let payload = history[old]?.payload {
                released.append(payload)
                history[old]!.payload = nil
            }
        }
        while historyOrder.count > config.history {
            if let payload = history.removeValue(forKey: historyOrder.removeFirst())?.payload { released.append(payload) }
        }
    }

    /// Hands over the values dropped from history (see `released`).
    mutating func takeReleased() -> [Payload] {
        defer { released = [] }
        return released
    }

    // MARK: - Ready queues

    private mutating func makeReady(_ id: OpID, now: UInt64) {
        let op = ops[id]!
        ops[id]!.state = .ready
        ops[id]!.readySince = now
        queues[op.queue]!.readyCount += 1
        queues[op.queue]!.lanes[op.host ?? "", default: Lane()].rings[Lane.slot(level: op.level, qos: op.qos)].append(id)
    }

    private mutating func unready(_ id: OpID) {
        let op = ops[id]!
        ops[id]!.state = .waiting  // its ring entry goes stale
        queues[op.queue]!.readyCount -= 1
    }

    private struct Candidate {
        var id: OpID
        var queue: QueueID
        var host: String
        var slot: Int
        var effective: UInt64
        var qos: Int
        var seq: UInt64

        /// Within a queue: effective level, then QoS, then FIFO.
        func beatsInQueue(_ other: Candidate) -> Bool {
            if effective != other.effective { return effective > other.effective }
            if qos != other.qos { return qos > other.qos }
            return seq < other.seq
        }

        /// Across queues (they share only hosts): QoS first.
        func beatsAcrossQueues(_ other: Candidate) -> Bool {
            if qos != other.qos { return qos > other.qos }
            return beatsInQueue(other)
        }
    }

    private mutating func hasCapacity(_ host: String, now: UInt64) -> Bool {
        if host.isEmpty { return true }
        guard hostRunning[host, default: 0] < config.maxPerHost else { return false }
        guard var bucket = bucket(for: host, now: now) else { return true }
        bucket.refill(now)
        buckets[host] = bucket
        if bucket.tokens >= 1 { return true }
        let wake = bucket.nextToken()
        rateWake = min(rateWake ?? wake, wake)
        return false
    }

    /// The host's token bucket, made on first use from the configured limit
    /// for "host:port", else "host", else "*"; nil when unlimited.
    private mutating func bucket(for host: String, now: UInt64) -> Bucket? {
        if let b = buckets[host] { return b }
        let bare = host.hasPrefix("[") ? String(host.prefix(through: host.firstIndex(of: "]") ?? host.startIndex))
                                       : String(host.split(separator: ":").first ?? Substring(host))
        guard let limit = config.rateLimits[host] ?? config.rateLimits[bare] ?? config.rateLimits["*"] else { return nil }
        let b = Bucket(limit: limit, tokens: limit.burst, refilledAt: now)
        buckets[host] = b
        return b
    }

    /// The best ready operation of a queue whose host has capacity.
    /// Drops stale ring entries it meets at the heads.
    private mutating func bestCandidate(in queueID: QueueID, now: UInt64) -> Candidate? {
        var best: Candidate? = nil
        let hosts = Array(queues[queueID]!.lanes.keys)  // a copy: the lanes are mutated below
        for host in hosts where hasCapacity(host, now: now) {
            for slot in 0..<25 {
                let level = slot / 5
                var head: OpID? = nil
                while let id = queues[queueID]!.lanes[host]!.rings[slot].first {
                    if let op = ops[id], op.state == .ready, op.level == level { head = id; break }
                    queues[queueID]!.lanes[host]!.rings[slot].removeFirst()
                }
                guard let id = head, let op = ops[id] else { continue }
                let waited = now > op.readySince ? now - op.readySince : 0
                let boost = config.agingNanos == 0 ? 0 : waited / config.agingNanos
                let candidate = Candidate(id: id, queue: queueID, host: host, slot: slot,
                                          effective: UInt64(level) &+ boost, qos: op.qos, seq: op.seq)
                if best == nil || candidate.beatsInQueue(best!) { best = candidate }
            }
        }
        return best
    }

    /// Starts whatever may start now.
    private mutating func schedule(now: UInt64, into actions: inout [Action]) {
        rateWake = nil
        while true {
            var best: Candidate? = nil
            for queueID in queueOrder {
                let eligible = queues[queueID].map {
                    !$0.suspended && $0.readyCount > 0 && $0.counters.running < $0.maxConcurrent
                } ?? false
                guard eligible else { continue }
                if let candidate = bestCandidate(in: queueID, now: now),
                   best == nil || candidate.beatsAcrossQueues(best!) {
                    best = candidate
                }
            }
            guard let chosen = best else { return }
            queues[chosen.queue]!.lanes[chosen.host]!.rings[chosen.slot].removeFirst()
            if queues[chosen.queue]!.lanes[chosen.host]!.rings.allSatisfy(\.isEmpty) {
                queues[chosen.queue]!.lanes[chosen.host] = nil
            }
            var op = ops[chosen.id]!
            op.state = .running
            let payloads = op.dependencyPayloads
            op.dependencyPayloads = []
            ops[chosen.id] = op
            queues[chosen.queue]!.readyCount -= 1
            queues[chosen.queue]!.counters.queued -= 1
            queues[chosen.queue]!.counters.running += 1
            counters.queued -= 1
            counters.running += 1
            if !chosen.host.isEmpty {
                hostRunning[chosen.host, default: 0] += 1
                buckets[chosen.host]?.tokens -= 1
            }
            actions.append(.start(chosen.id, dependencies: payloads))
        }
    }

    // MARK: - Time limits

    /// The earliest time something is due (a start deadline, a retry, a
    /// rate-limit token), for the runtime's timer.
    mutating func nextDeadline() -> UInt64? {
        var next = rateWake
        while let top = deadlines.min {
            if let op = ops[top.value], op.state == .waiting || op.state == .ready {
                next = min(next ?? top.key, top.key)
                break
            }
            deadlines.removeMin()
        }
        while let top = retries.min {
            if ops[top.value]?.state == .backoff {
                next = min(next ?? top.key, top.key)
                break
            }
            retries.removeMin()
        }
        return next
    }

    /// Whether work is held back by a rate limit (the timer must wake up).
    var waitsForTokens: Bool { rateWake != nil }

    /// A running operation will be tried again at `until`: it gives up its
    /// slot meanwhile (cancelling it then ends it at once).
    mutating func retryLater(_ id: OpID, until: UInt64, now: UInt64) -> [Action] {
        guard let op = ops[id], op.state == .running else { return [] }
        ops[id]!.state = .backoff
        queues[op.queue]!.counters.running -= 1
        queues[op.queue]!.counters.queued += 1
        counters.running -= 1
        counters.queued += 1
        if let host = op.host { hostRunning[host, default: 1] -= 1 }
        retries.insert(id, key: until)
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return actions
    }

    /// Fails the operations whose start deadline has passed.
    mutating func expire(now: UInt64, waitedMessage: (OpID) -> String) -> [Action] {
        var actions: [Action] = []
        while let top = deadlines.min, top.key <= now {
            deadlines.removeMin()
            if let op = ops[top.value], op.state == .waiting || op.state == .ready {
                end(top.value, .failed, .queueTimeout, waitedMessage(top.value), now: now, into: &actions)
            }
        }
        while let top = retries.min, top.key <= now {
            retries.removeMin()
            if ops[top.value]?.state == .backoff { makeReady(top.value, now: now) }
        }
        schedule(now: now, into: &actions)
        return actions
    }

    // MARK: - Queries

    func isLive(_ id: OpID) -> Bool { ops[id] != nil }
    func state(of id: OpID) -> OpState? { ops[id]?.state }
    func group(of id: OpID) -> String? { ops[id]?.group }
    func finishedOutcome(of id: OpID) -> Outcome? { history[id]?.outcome }
    var liveCount: Int { ops.count }
}
