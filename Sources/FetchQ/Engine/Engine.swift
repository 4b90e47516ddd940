import CFetchQSupport
import CJansson
import Glibc

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
    private let lock = ConditionLock()
    private var machine: Machine
    private var live: [OpID: Operation] = [:]
    private var queues: [QueueID: Queue] = [:]
    /// Operations submitted whose callback has not returned yet.
    private var outstanding: [QueueID: Int] = [:]
    private var outstandingTotal = 0
    private var shuttingDown = false
    private var workers: WorkerPool!
    private var delivery: Delivery!
    private var timer: DeadlineTimer!

    public init(config: EngineConfig) throws(FetchQError) {
        self.config = config
        machine = Machine(config: .init(
            agingNanos: UInt64(config.agingMs) * 1_000_000,
            maxPerHost: config.maxPerHost,
            history: config.history))
        let owner = selfPointer
        delivery = try Delivery(mode: config.delivery, owner: owner) { [unowned self] item in
            delivered(item)
        }
        workers = WorkerPool(count: config.workers, owner: owner)
        timer = DeadlineTimer { [unowned self] in expireDeadlines() }
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
        try runThrowing { $0.setPriority(id, priority, now: monotonicNanos()) }
    }

    public func addDependency(_ id: OpID, on dep: OpID) throws(FetchQError) {
        try runThrowing { $0.addDependency(id, on: dep, now: monotonicNanos()) }
    }

    // MARK: - Carrying out the state machine's actions

    private enum Work {
        case start(Operation)
        case deliver(Delivery.Item)
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
        work.reserveCapacity(actions.count)
        for action in actions {
            switch action {
            case .start(let id, let dependencies):
                guard let op = live[id] else { continue }
                op.dependencies = dependencies
                work.append(.start(op))
            case .complete(let id, let outcome, let status, let message):
                guard let op = live.removeValue(forKey: id) else { continue }
                let result = OperationResult(id: id, outcome: outcome, status: status, message: message, value: nil)
                work.append(.deliver(.init(result: result, completion: op.completion, queue: op.queue)))
            case .cancelRunning(let id):
                live[id]?.markCancelled()
            }
        }
        return work
    }

    private func execute(_ work: [Work]) {
        for item in work {
            switch item {
            case .start(let op): start(op)
            case .deliver(let item): delivery.post(item)
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
        }
    }

    /// A running operation's body ended (block returned, async finished).
    func bodyEnded(_ op: Operation, value: JSONRef?, error: String?) {
        let result: OperationResult
        if op.isCancelled {
            result = OperationResult(id: op.id, outcome: .cancelled, status: .cancelled,
                                     message: "operation \(op.id) was cancelled", value: nil)
        } else if let error {
            result = OperationResult(id: op.id, outcome: .failed, status: .operation, message: error, value: nil)
        } else {
            result = OperationResult(id: op.id, outcome: .succeeded, status: .ok, message: nil, value: value)
        }
        finishRunning(op, result)
    }

    /// Books a running operation's result and delivers it.
    func finishRunning(_ op: Operation, _ result: OperationResult) {
        lock.lock()
        guard machine.state(of: op.id) == .running else {
            lock.unlock()
            return
        }
        let actions = machine.finished(op.id, result.outcome, payload: result, now: monotonicNanos())
        live[op.id] = nil
        let work = resolve(actions)
        lock.unlock()
        delivery.post(.init(result: result, completion: op.completion, queue: op.queue))
        execute(work)
    }

    /// After a callback returned.
    private func delivered(_ item: Delivery.Item) {
        lock.lock()
        let left = outstanding[item.queue, default: 1] - 1
        outstanding[item.queue] = left == 0 ? nil : left
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
        let next = machine.nextDeadline()
        let work = resolve(actions)
        lock.unlock()
        execute(work)
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
        return JSONRef(owned: root)
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
        let work = resolve(machine.cancelAll(now: monotonicNanos()).actions)
        lock.unlock()
        execute(work)
        _ = wait(queue: nil, timeoutMs: -1)
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
