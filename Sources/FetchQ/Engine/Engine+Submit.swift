import CFetchQSupport
import CJansson
import Glibc
import Logging

// Submitting operations: option parsing, then the scheduler under the lock.

extension Engine {
    // MARK: - Submitting

    /// config.network.maxWaitMs (read per submit: copying the whole config
    /// struct out of the engine for it cost ~170 instructions per submit).
    var defaultMaxWaitMs: Int { config.network.maxWaitMs }

    /// The options every submit reads: refuses while shutting down, reads the
    /// common options, then `more` reads the submit's own keys, then checks
    /// that no unknown key is left.
    func readOptions<T>(_ options: UnsafePointer<json_t>?,
                        _ more: (inout OptionReader) throws(FetchQError) -> T) throws(FetchQError) -> (CommonOptions, T) {
        try refuseIfShuttingDown()
        var reader = try OptionReader(options, context: "options")
        let common = try CommonOptions(reading: &reader, defaultMaxWaitMs: defaultMaxWaitMs)
        let extra = try more(&reader)
        try reader.finish()
        return (common, extra)
    }

    /// While the engine is being freed every submit fails with
    /// FQ_ERR_SHUTDOWN, whatever else is wrong with it.
    func refuseIfShuttingDown() throws(FetchQError) {
        if shutdownStarted.load(ordering: .acquiring) { throw FetchQError(.shutdown, "the engine is being freed") }
    }

    /// Submits an operation. Throws (and never calls `completion`) when the
    /// options are invalid, a dependency is unknown, or the engine is
    /// shutting down; otherwise `completion` is called exactly once.
    public func submit(_ body: OperationBody, to queue: Queue, options: UnsafePointer<json_t>?,
                       completion: Completion?) throws(FetchQError) -> OpID {
        try submit(body, to: queue, options: options, callback: Callback(completion))
    }

    public func submit(_ body: OperationBody, to queue: Queue, options: UnsafePointer<json_t>?,
                       callback: Callback) throws(FetchQError) -> OpID {
        guard options != nil else {
            // No options: the defaults, without scanning anything.
            try refuseIfShuttingDown()
            return try enqueueBody(body, queue: queue.id, common: CommonOptions(defaultMaxWaitMs: defaultMaxWaitMs),
                                   callback: callback)
        }
        let (common, _) = try readOptions(options) { (_: inout OptionReader) throws(FetchQError) in }
        return try enqueueBody(body, queue: queue.id, common: common, callback: callback)
    }

    /// A block or async operation. Without a barrier it goes through the
    /// inbox (see SubmitInbox): its id is given here and the submit returns
    /// without waiting for the engine lock. With "depends_on" only if the
    /// dependency gate lets it (each id still remembered, see
    /// DependencyGate); else its dependencies are checked under the lock.
    private func enqueueBody(_ body: OperationBody, queue: QueueID, common: CommonOptions,
                             callback: Callback) throws(FetchQError) -> OpID {
        var phase = -1
        if !common.dependsOn.isEmpty && !common.barrier {
            phase = gate.enter(common.dependsOn, handedOut: nextID.load(ordering: .relaxed)) ?? -1
        }
        guard !common.barrier && (common.dependsOn.isEmpty || phase >= 0) else {
            return try enqueue(body, queue: queue, common: common, host: nil, callback: callback)
        }
        let now = monotonicNanos()
        let id = newID()
        let op = Operation(id: id, queue: queue, qos: common.qos, body: body, callback: callback, engine: self,
                           submittedAt: now)
        let deadline = common.startDeadline(now: now)
        switch inbox.push(.init(op: op, priority: common.priority, group: common.group, startDeadline: deadline,
                                dependsOn: common.dependsOn, gatePhase: phase)) {
        case .queued: break
        case .mustLock:
            lockEngine()  // books it
            unlockEngine()
        case .refused(let error):
            if phase >= 0 { gate.leave(phase) }
            throw error
        }
        if deadline != nil { timer.kick() }
        return id
    }

    /// Submits an HTTP request (`request`: method, url, headers, query, body).
    public func submitRequest(_ request: UnsafePointer<json_t>?, to queue: Queue, options: UnsafePointer<json_t>?,
                              completion: Completion?) throws(FetchQError) -> OpID {
        try submitRequest(request, to: queue, options: options, callback: Callback(completion))
    }

    public func submitRequest(_ request: UnsafePointer<json_t>?, to queue: Queue, options: UnsafePointer<json_t>?,
                              callback: Callback) throws(FetchQError) -> OpID {
        let (common, job) = try readOptions(options) { (r: inout OptionReader) throws(FetchQError) in
            try NetworkJob.makeRequest(request, options: &r, config: config)
        }
        return try enqueueNetwork(job, queue: queue.id, common: common, callback: callback)
    }

    /// Submits a search: `query` goes into the endpoint's URL template; the
    /// value is {"query", "items", "count"}.
    public func submitSearch(_ query: String, to queue: Queue, options: UnsafePointer<json_t>?,
                             completion: Completion?) throws(FetchQError) -> OpID {
        try submitSearch(query, to: queue, options: options, callback: Callback(completion))
    }

    public func submitSearch(_ query: String, to queue: Queue, options: UnsafePointer<json_t>?,
                             callback: Callback) throws(FetchQError) -> OpID {
        let (common, job) = try readOptions(options) { (r: inout OptionReader) throws(FetchQError) in
            if r.allRead, let template = defaultSearch { return try template.job(for: query) }
            return try NetworkJob.makeSearch(query, options: &r, config: config, openStore: store(path:))
        }
        return try enqueueNetwork(job, queue: queue.id, common: common, callback: callback)
    }

    /// Submits a fan-out search: one child search per distinct query (each a
    /// normal operation of `queue`, honouring its limits and priorities) and a
    /// parent that collects them and completes once with the merged,
    /// de-duplicated, sorted items. Cancelling the parent cancels the children.
    public func submitSearchAll(_ queries: [String], to queue: Queue, options: UnsafePointer<json_t>?,
                                completion: Completion?) throws(FetchQError) -> OpID {
        try submitSearchAll(queries, to: queue, options: options, callback: Callback(completion))
    }

    public func submitSearchAll(_ queries: [String], to queue: Queue, options: UnsafePointer<json_t>?,
                                callback: Callback) throws(FetchQError) -> OpID {
        let (common, (failFast, childEvents, template)) = try readOptions(options) {
            (r: inout OptionReader) throws(FetchQError) in
            (try r.bool("fail_fast") ?? false, try r.bool("child_events") ?? false,
             try SearchTemplate(reading: &r, config: config, openStore: store(path:)))
        }
        guard !common.barrier else { throw FetchQError(.invalid, "options.barrier: not supported for search-all") }
        var seen = Set<ExactString>()  // by bytes: "é" and "e\u{301}" are two queries
        let unique = queries.filter { seen.insert(ExactString($0)).inserted }
        guard !unique.isEmpty else { throw FetchQError(.invalid, "search-all needs at least one query") }
        var jobs: [NetworkJob] = []
        for q in unique { jobs.append(try template.job(for: q)) }
        let cached = jobs.map(answeredByTheCache)
        let family = SearchAllFamily(template: template, failFast: failFast, childEvents: childEvents)

        let now = monotonicNanos()
        lockEngine()
        guard !shuttingDown else {
            unlockEngine()
            throw FetchQError(.shutdown, "the engine is being freed")
        }
        var actions: [Machine.Action] = []
        for (i, (q, job)) in zip(unique, jobs).enumerated() {
            let child = Operation(id: 0, queue: queue.id, qos: common.qos, body: .network(job), callback: .none, engine: self)
            child.family = family
            var childSpec = Self.spec(queue: queue.id, common: common, job: job, answeredByTheCache: cached[i],
                                      owner: child, now: now)
            childSpec.id = newID()
            switch machine.submit(childSpec, now: now) {
            case .success(let (id, more)):
                child.id = id
                family.children.append(id)
                family.queries[id] = q
                actions += more
            case .failure(let error):
                // Only the first child can fail (they share queue and deps).
                unlockEngine()
                throw error
            }
        }
        // The parent collects the children and shares their dependencies:
        // if one of those failed, the parent ends cancelled naming it.
        let parent = Operation(id: 0, queue: queue.id, qos: common.qos,
                               body: .block { op in family.merge(op) }, callback: callback, engine: self)
        parent.family = family
        var parentSpec = Self.spec(queue: queue.id, common: common, host: nil, owner: parent, now: now)
        parentSpec.startDeadline = nil
        parentSpec.collects = family.children
        parentSpec.networkValue = true  // a search's value: "history_values" bounds it
        parentSpec.id = newID()
        let parentSubmit = machine.submit(parentSpec, now: now)
        guard case .success(let (parentID, more)) = parentSubmit else {
            // Cannot happen once the children were accepted (same queue, same
            // dependencies); roll them back rather than leave them orphaned.
            // Their objects are kept until the work is done: a child's start
            // action does not hold its object (its slot did, until here).
            let children = family.children.compactMap { machine.owner(of: $0) }
            for child in family.children {
                machine.setOwner(nil, of: child)  // no completion for a child rolled back
                if case .success(let more) = machine.cancel(child, now: now) { actions += more }
            }
            let work = resolve(actions)
            unlockEngine()
            execute(work)
            withExtendedLifetime(children) {}
            if case .failure(let error) = parentSubmit { throw error }
            throw FetchQError(.invalid, "search-all could not be submitted")
        }
        parent.id = parentID
        family.parent = parentID
        outstanding.add(queue.id, family.children.count + 1)
        let work = resolve(actions + more)
        unlockEngine()
        execute(work)
        if common.maxWaitMs > 0 { timer.kick() }
        return parentID
    }

    /// The item store at `path`, kept open while it is among the engine's
    /// `keptStores` most recently used (see `stores`).
    func store(path: String) throws(FetchQError) -> ItemStore {
        let store = try ItemStore.shared(path: path)
        let dropped: [ItemStore] = lock.withLock {
            stores.removeAll { $0 === store }
            stores.append(store)
            guard stores.count > Self.keptStores else { return [] }
            let old = Array(stores.prefix(stores.count - Self.keptStores))
            stores.removeFirst(old.count)
            return old
        }
        withExtendedLifetime(dropped) {}  // closed here if nobody else holds them, not under the lock
        return store
    }

    /// A network operation: coalesced with an identical in-flight GET when
    /// it can be (no dependencies, no barrier), else queued on its own. The
    /// first of identical GETs runs the transfer itself (see SharedTransfer).
    func enqueueNetwork(_ job: NetworkJob, queue: QueueID, common: CommonOptions,
                        callback: Callback) throws(FetchQError) -> OpID {
        if answeredByTheCache(job) {
            // Nothing is sent: no slot of its host, no rate token, no shared transfer.
            return try enqueue(.network(job), queue: queue, common: common, host: nil, callback: callback, sharing: nil)
        }
        return try enqueue(.network(job), queue: queue, common: common, host: job.host, callback: callback,
                           sharing: sharingKey(job, common))
    }

    /// Whether the cache answers `job` without the network: always with
    /// "only-if-cached", and with "default" when a fresh entry is there now.
    /// (One that goes stale while the operation waits in its queue is
    /// revalidated all the same.)
    private func answeredByTheCache(_ job: NetworkJob) -> Bool {
        switch job.cache {
        case .onlyIfCached:
            return httpCache != nil && job.cacheKey != nil
        case .default:
            // (The key costs more to make than this look, on every GET's submit.)
            guard let cache = httpCache, !cache.holdsNothing, let key = job.cacheKey else { return false }
            return cache.hasFresh(key, now: wallClockSeconds(), requestCacheControl: job.requestCacheControl)
        case .reload, .staleWhileRevalidate:
            return false
        }
    }

    /// Receives progress events of operations submitted with "progress".
    public func setEventHandler(_ handler: EventHandler?) {
        lock.withLock { eventHandler = handler }
    }

    /// Submits an operation to the state machine. With `key` (a coalescible
    /// GET), it attaches to the identical transfer in flight if there is
    /// one (no slot, host or deadline of its own), else it leads a new one.
    func enqueue(_ body: OperationBody, queue: QueueID, common: CommonOptions, host: String?,
                 callback: Callback, sharing key: CoalesceKey? = nil) throws(FetchQError) -> OpID {
        let now = monotonicNanos()
        // Made before locking (its id is set under the lock, before anyone
        // else can see it): the lock is held for the bookkeeping only.
        let op = Operation(id: 0, queue: queue, qos: common.qos, body: body, callback: callback, engine: self,
                           submittedAt: now)
        var spec = Self.spec(queue: queue, common: common, host: host, owner: op, now: now)
        if case .network = body { spec.network = true }
        lockEngine()
        var actions: [Machine.Action] = []
        let id: OpID
        do {
            id = try admit(op, &spec, common: common, sharing: key, now: now, into: &actions)
        } catch {
            unlockEngine()
            throw error
        }
        // An operation attached to a shared transfer has no deadline of its own.
        let kick = spec.startDeadline != nil && op.shared == nil
        let work = resolve(actions)
        unlockEngine()
        if !work.isEmpty { execute(work) }
        if kick { timer.kick() }
        return id
    }

    /// The scheduler spec of an operation, made outside the lock.
    @inline(__always)
    static func spec(queue: QueueID, common: borrowing CommonOptions, host: String?, owner: Operation,
                     now: UInt64) -> Machine.Spec {
        var spec = Machine.Spec(queue: queue)
        spec.priority = common.priority
        spec.qos = common.qos
        if let group = common.group { spec.group = group }
        spec.host = host
        if !common.dependsOn.isEmpty { spec.dependsOn = common.dependsOn }
        spec.barrier = common.barrier
        spec.startDeadline = common.startDeadline(now: now)
        spec.owner = owner
        return spec
    }

    /// A network operation's spec: without a host (no host slot or rate
    /// token) when the cache answers it (`answeredByTheCache`).
    static func spec(queue: QueueID, common: borrowing CommonOptions, job: NetworkJob, answeredByTheCache: Bool,
                     owner: Operation, now: UInt64) -> Machine.Spec {
        var spec = spec(queue: queue, common: common, host: answeredByTheCache ? nil : job.host, owner: owner, now: now)
        spec.network = true
        return spec
    }

    /// With the lock held: gives `op` its id in the state machine and books
    /// it (coalescing, counters). Throws, having changed nothing,
    /// when the engine is being freed or the scheduler refuses the spec.
    func admit(_ op: Operation, _ spec: inout Machine.Spec, common: borrowing CommonOptions, sharing key: CoalesceKey?,
               now: UInt64, into actions: inout [Machine.Action]) throws(FetchQError) -> OpID {
        guard !shuttingDown else { throw FetchQError(.shutdown, "the engine is being freed") }
        // The first submit with dependencies opens the gate for those after
        // it (under this lock: see DependencyGate).
        if !spec.dependsOn.isEmpty && !gate.isOpen { gate.open() }
        if spec.id == nil { spec.id = newID() }
        let existing = key.flatMap { coalesced[$0] }
        if existing != nil {
            spec.attached = true
            spec.host = nil
            spec.startDeadline = nil
        }
        let id: OpID
        switch machine.submit(spec, now: now, into: &actions) {
        case .success(let submitted): id = submitted
        case .failure(let error): throw error
        }
        op.id = id
        if let shared = existing {
            op.shared = shared
            shared.callers.append(op)
            actions += shared.lift(to: common.priority, in: &machine, now: now)
        } else if let key {
            let shared = SharedTransfer(key: key, priority: common.priority, maxWaitMs: common.maxWaitMs)
            shared.carrier = id
            op.leads = shared
            coalesced[key] = shared
        }
        outstanding.add(spec.queue)
        return id
    }

    /// How many operations `submitRequests` books per hold of the engine
    /// lock: a long batch does not keep transfers from ending meanwhile.
    static let batchPerLock = 64

    /// `fq_submit_requests`: one request per URL, all from one request
    /// object and one options object, read once; every URL is checked before
    /// any operation is submitted. Returns the ids in order. Fewer than
    /// `urls.count` only when the scheduler stopped taking them during the
    /// call (the queue closed, the engine began shutting down, a dependency
    /// left history; `stopped` says why); nothing submitted is a throw.
    public func submitRequests(_ request: UnsafePointer<json_t>?, urls: [String], to queue: Queue,
                               options: UnsafePointer<json_t>?, callbacks: (Int) -> Callback)
        throws(FetchQError) -> (ids: [OpID], stopped: FetchQError?)
    {
        let (common, template) = try readOptions(options) { (r: inout OptionReader) throws(FetchQError) in
            var (template, _) = try RequestTemplate.read(request, urlGiven: false, options: &r, config: config)
            try template.readResponseOptions(&r)
            return template
        }
        var jobs: [NetworkJob] = []
        jobs.reserveCapacity(urls.count)
        for (i, url) in urls.enumerated() {
            do {
                var job = try template.job(url: url)
                template.applyResponseOptions(to: &job)
                jobs.append(job)
            } catch {
                throw FetchQError(error.status, "urls[\(i)]: \(error.message)")
            }
        }
        var ids: [OpID] = []
        ids.reserveCapacity(jobs.count)
        var next = 0
        while next < jobs.count {
            let now = monotonicNanos()
            let end = min(next + Self.batchPerLock, jobs.count)
            var prepared: [(Operation, Machine.Spec, CoalesceKey?)] = []
            prepared.reserveCapacity(end - next)
            for i in next..<end {
                let job = jobs[i]
                let op = Operation(id: 0, queue: queue.id, qos: common.qos, body: .network(job), callback: callbacks(i),
                                   engine: self, submittedAt: now)
                let cached = answeredByTheCache(job)  // as in enqueueNetwork
                prepared.append((op, Self.spec(queue: queue.id, common: common, job: job, answeredByTheCache: cached,
                                               owner: op, now: now),
                                 cached ? nil : sharingKey(job, common)))
            }
            var actions: [Machine.Action] = []
            var stopped: FetchQError? = nil
            lockEngine()
            for (op, spec, key) in prepared {
                var spec = spec
                do {
                    ids.append(try admit(op, &spec, common: common, sharing: key, now: now, into: &actions))
                } catch {
                    stopped = error
                    break
                }
            }
            let work = resolve(actions)
            unlockEngine()
            if !work.isEmpty { execute(work) }
            if common.maxWaitMs > 0 { timer.kick() }
            if let stopped {
                if ids.isEmpty { throw stopped }
                return (ids, stopped)
            }
            next = end
        }
        return (ids, nil)
    }

    /// The key identical in-flight GETs share (see `enqueueNetwork`).
    func sharingKey(_ job: NetworkJob, _ common: CommonOptions) -> CoalesceKey? {
        // The transfer's max_wait_ms is part of what is shared: callers join
        // only a transfer with the same limit.
        common.dependsOn.isEmpty && !common.barrier ? job.coalesceKey(maxWaitMs: common.maxWaitMs) : nil
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

    /// Made once (building it per submit was an allocation per operation).
    static let qosNames = QoS.allCases.reversed().map(\.name)

    /// When an operation submitted at `now` must have started (max_wait_ms).
    func startDeadline(now: UInt64) -> UInt64? {
        maxWaitMs > 0 ? now + UInt64(maxWaitMs) * 1_000_000 : nil
    }

    /// The defaults (a submit with no options object).
    init(defaultMaxWaitMs: Int) {
        maxWaitMs = defaultMaxWaitMs
    }

    init(reading r: inout OptionReader, defaultMaxWaitMs: Int) throws(FetchQError) {
        maxWaitMs = defaultMaxWaitMs
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
        if let name = try r.choice("qos", Self.qosNames) { qos = QoS(name: name)! }
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
