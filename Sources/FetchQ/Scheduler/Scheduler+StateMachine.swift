/// The scheduler's decisions, as a plain value with no threads and no I/O:
/// what may start (queue limits, suspension, per-host limits, priorities with
/// aging, QoS), what a cancel does, and what a completion unblocks. Every
/// event returns the actions the runtime must carry out. `Payload` is the
/// runtime's result object, carried along dependency edges for data passing;
/// `Owner` is the runtime's object for a live operation, kept in its slot
/// (so the runtime needs no table of its own from id to object).
///
/// Ordering rule (documented in include/fetchq.h): within a queue the next
/// operation is the ready one with the highest effective level, where
/// effective level = priority level (0...4) + one per `agingNanos` it has
/// waited since it became ready; ties go to the higher QoS, then to the
/// earlier submission (FIFO). Across queues (which compete only for hosts)
/// the same key decides, QoS first.
struct SchedulerStateMachine<Payload, Owner: AnyObject> {
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
        var historyValues: Int = 32
        /// Token buckets per host key ("host:port", "host", or "*" for any).
        var rateLimits: [String: RateLimit] = [:]
        /// A payload cheap to free (no value): dropped from history right
        /// away instead of handed to the runtime through `released`.
        var isLight: (Payload) -> Bool = { _ in false }
        /// What the history keeps of a network operation's payload: the
        /// payload itself, or a cheaper stand-in made when it was (the
        /// runtime's `OperationResult.historyForm`). Only dependents
        /// submitted after the operation ended get it; those linked before
        /// get the payload itself.
        var historyForm: (Payload) -> Payload = { $0 }
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
        /// of its strict (all succeeded) and collect dependencies; its owner,
        /// not retained: the operation's slot keeps it until the operation
        /// ends, which it cannot before it started (so the runtime takes its
        /// own reference when it likes, after the lock too); `network`: it
        /// has a host (a request, search or carrier).
        case start(OpID, dependencies: [Dependency], owner: Unmanaged<Owner>?, network: Bool)
        /// The scheduler ended an operation that never started (cancelled,
        /// dependency failed, queue timeout): deliver its completion. The
        /// owner it had (the operation no longer keeps it).
        case complete(OpID, Outcome, FQStatus, EndReason, Owner?)
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
        /// A network operation without a host (the HTTP cache answers it:
        /// no host slot or rate token); one with a host is one anyway.
        var network = false
        /// Its value is kept in history as a network result's is (bounded by
        /// `historyValues`), though it runs on a worker: a search-all's parent.
        var networkValue = false
        var dependsOn: [OpID] = []
        /// Operations whose results this one collects (must be unfinished).
        var collects: [OpID] = []
        var barrier = false
        /// Absolute monotonic deadline for starting, nil for none.
        var startDeadline: UInt64? = nil
        /// Not started before this monotonic time: booked as waiting to be
        /// tried again (`retryLater`), for work carried on from an operation
        /// that was waiting so.
        var notBefore: UInt64? = nil
        /// Engine-internal work (a coalesced transfer): holds a slot but is
        /// not counted in submitted/succeeded/failed/cancelled.
        var isInternal = false
        /// Shares another operation's transfer: never takes a slot; the
        /// runtime ends it. Takes no dependencies, barrier or host.
        var attached = false
        /// An internal carrier's callers (attached): it waits for an open
        /// barrier of its queue unless the barrier waits for one of them.
        var carried: [OpID] = []
        /// The runtime's object, kept until the operation ends.
        var owner: Owner? = nil
        /// The id, when the runtime hands ids out itself (it must then
        /// hand out every id, each once); nil: the next of the scheduler's.
        var id: OpID? = nil
    }

    /// waiting: for dependencies; ready: for a slot; running: holds a slot;
    /// backoff: between two attempts (no slot) until its retry time;
    /// attached: sharing another operation's transfer (no slot).
    /// finished: remembered for depends_on (see Config.history), no longer live.
    enum OpState { case waiting, ready, running, backoff, attached, finished }

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

    /// One operation, live or remembered after it finished. Stored by value
    /// in `slots` and found through `index`; fields are read and written in
    /// place. What only some operations have (a group, edges, collected
    /// results) is in `linkTable`, so that an `Op` holds no more than two
    /// references and is cheap to book, reset and reuse.
    struct Op {
        var id: OpID = 0
        var queue: QueueID = 0
        var seq: UInt64 = 0
        /// The runtime's number for its completion (`noteCompletion`), 0
        /// until it ended.
        var completionSeq: UInt64 = 0
        var readySince: UInt64 = 0
        /// Index into `hosts`; 0 for operations without a host.
        var host: Int32 = 0
        /// Index into `linkTable`; -1: none (no group, edges or payloads).
        var links: Int32 = -1
        var level: Int8 = 0
        var qos: Int8 = 0
        var state: OpState = .waiting
        var cancelRequested = false
        var isBarrier = false
        var isInternal = false
        /// Run by the transport (`Action.start`'s `network`).
        var isNetwork = false
        /// `Spec.networkValue`.
        var hasNetworkValue = false
        /// Finished: ended by a cancel of its own (not a failed dependency).
        var cancelledByOwn = false
        /// Finished: `payload` is light (`Config.isLight`), noted while it is
        /// fresh: dropping it from history then does not read it (under the
        /// lock, 4 096 finishes later, that read was a cache miss).
        var payloadIsLight = false
        var outcome: Outcome = .succeeded
        /// The level it was submitted at (set by `book`), or the one it had
        /// when `addDependency` made it wait again (`unready`): its FIFO entry
        /// there carries `seq`. At any other level its entry carries
        /// `Links.movedSeq` (`setPriority`). In a byte the layout leaves free.
        var firstLevel: Int8 = 0
        var waitingOn: Int32 = 0
        /// The queue's list of unfinished operations (slot numbers, -1 none).
        var prev: Int32 = -1
        var next: Int32 = -1
        /// Finished: the result kept for later dependents.
        var payload: Payload? = nil
        /// Live: the runtime's object (nil once finished), retained by the
        /// slot: `setOwnerRef` and `clearOwner` keep the count. Not a strong
        /// reference, so that a `.start` action can carry it without touching
        /// the object (a cache miss under the lock: the submitting thread
        /// made it).
        var owner: Unmanaged<Owner>? = nil
    }

    /// An operation's group and edges (see `Op.links`); a live operation's
    /// only: `retire` gives them back.
    struct Links {
        var group: String? = nil
        var dependents: [Dependent] = []
        /// Strict and collect dependencies, for cycle checks.
        var dependencies: [OpID] = []
        var dependencyPayloads: [Dependency] = []
        /// Moved by `setPriority` to a level other than its first: the
        /// sequence number its FIFO entry there carries (fresh at each move,
        /// so an entry left at that level by an earlier visit is stale).
        var movedSeq: UInt64 = 0
        /// An internal carrier: the callers whose transfer it carries.
        var carried: [OpID] = []
        /// A fan-in (search-all): the operations it collects, which
        /// `removeDependency` leaves alone.
        var collects: [OpID] = []
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

    /// Ready operations of one queue for one host. Its 25 FIFOs, one per
    /// (priority level, QoS) so equal priorities go by QoS then by age, are
    /// `rings[lane * 25 + slot]`; `mask` has a bit per non-empty FIFO.
    struct Lane {
        var queue: QueueID
        var host: Int32
        var mask: UInt32 = 0
        static func slot(level: Int, qos: Int) -> Int { level * 5 + qos }
    }

    /// A history entry: the slot, and the id to notice a reused slot.
    struct Entry {
        var id: OpID
        var slot: Int32
    }

    /// A ready-FIFO entry: the slot and the id (to notice a stale entry),
    /// and what ordering needs, so that comparing the heads of a lane's
    /// FIFOs does not read their operations (with a large backlog each
    /// such read was a cache miss).
    struct ReadyEntry {
        var id: OpID
        var seq: UInt64
        var readySince: UInt64
        var slot: Int32
    }

    struct Queue {
        var name: String
        var maxConcurrent: Int
        var suspended = false
        var closed = false
        /// Closed and done: forgotten (kept in `queues` so ids stay indices).
        var removed = false
        /// Lane number by host index (-1: none yet), and the lanes in use.
        var laneByHost: [Int32] = []
        var lanes: [Int32] = []
        var readyCount = 0
        /// Index in `activeQueues` (-1: not there) and in `queueOrder`.
        var activeAt: Int32 = -1
        var orderAt: Int32 = -1
        /// FIFO entries made stale since the queue's FIFOs were last
        /// compacted (see `noteStale`).
        var staleEntries = 0
        /// Running internal operations (carriers), counted in
        /// `counters.running` (they hold a slot) but not in the stats.
        var internalRunning = 0
        /// Unfinished operations, oldest first (a list through `Op.prev/next`).
        var head: Int32 = -1
        var tail: Int32 = -1
        var unfinishedCount = 0
        var openBarrier: OpID? = nil
        var counters = Counters()
    }

    /// A host's running count and token bucket (index 0: no host).
    struct Host {
        var name: String
        var running = 0
        var bucket: Bucket? = nil
        var bucketMade = false
    }

    private(set) var config: Config
    /// Operations by slot; free slots are listed in `freeSlots`.
    private let slab = Slab<Op>()
    /// `slots[s].field` reads or writes one field in place.
    private var slots: UnsafeMutablePointer<Op> { slab.base }
    private var freeSlots: [Int32] = []
    /// By `Op.links`; free entries are listed in `freeLinks`.
    private var linkTable: [Links] = []
    private var freeLinks: [Int32] = []
    /// Slot by id, for live operations and those remembered in history.
    private var index = IDTable<Int32>()
    /// Live operations (not finished).
    private(set) var liveCount = 0
    /// Barriers not yet ended: while there is none, `dependencies` lists
    /// every wait of a live operation (see `waits`).
    private var liveBarriers = 0
    /// By QueueID (index 0 unused). Not optionals: reading a field of an
    /// optional element copied the whole `Queue` value.
    private(set) var queues: [Queue] = [Queue(name: "", maxConcurrent: 0, removed: true)]
    private(set) var counters = Counters()
    /// Internal operations (carriers of a shared transfer) now running:
    /// `counters.running` counts them (they hold a slot), but no caller
    /// waits for their callback (`Engine.stats`'s "undelivered").
    private(set) var internalRunning = 0

    private mutating func noteInternalRunning(_ q: QueueID, _ delta: Int) {
        internalRunning += delta
        queues[q].internalRunning += delta
    }
    private var lanes: [Lane] = []
    private var rings: [Ring<ReadyEntry>] = []
    /// Lanes of forgotten queues, for new lanes to take (their rings emptied).
    private var freeLanes: [Int32] = []
    /// Lanes made so far (in use or free): for tests.
    var laneCount: Int { lanes.count }
    private var hosts: [Host] = [Host(name: "")]
    private var hostIndex: [ExactString: Int32] = [:]
    private var groups: [ExactString: Set<OpID>] = [:]
    /// Slots of finished operations, oldest first.
    private var historyOrder = Ring<Int32>()
    /// Finished network operations holding a value, oldest first.
    private var valueOrder = Ring<Entry>()
    /// Values dropped from history, to be released by the runtime after it
    /// unlocks (freeing a big parsed document must not hold the lock).
    private(set) var released: [Payload] = []
    /// The last light payload dropped from history (see `Config.isLight`),
    /// for the runtime to free after it unlocks (`takeDropped`) when it
    /// cares to; an earlier one still here is freed when this replaces it.
    private var dropped: Payload? = nil
    private var deadlines = MinHeap<OpID>()
    /// At this many entries `deadlines` drops those of operations that no
    /// longer wait to start (only its top left as time passed: an operation
    /// waiting long kept an entry for each one that came and went after it,
    /// about 20 bytes each: the tenth review).
    private var deadlinesCompactAt = 1024
    /// Operations in backoff, by retry time.
    private var retries = MinHeap<OpID>()
    /// Operations that started and wait to be tried again (`retryLater`),
    /// until they end: their start deadline ("max_wait_ms") no longer
    /// applies. (Ready again after the wait, one ended FQ_ERR_QUEUE_TIMEOUT
    /// when its deadline came while it waited for a slot: the ninth review.)
    private var restarted = Set<OpID>()
    /// The earliest time a token frees an operation held back by a rate limit.
    private var rateWake: UInt64? = nil
    private var nextOpID: OpID = 1
    private var nextSeq: UInt64 = 0
    /// Queue ids not yet forgotten, in no particular order (`Queue.orderAt`).
    private var queueOrder: [QueueID] = []
    /// Queues with ready operations, not suspended (`Queue.activeAt`): all
    /// that `schedule` looks at, so that idle and suspended queues cost
    /// nothing.
    private var activeQueues: [QueueID] = []
    /// Open queues by name.
    private var queueByName: [ExactString: QueueID] = [:]
    /// Queues forgotten (closed, then done), oldest first: their ids may be
    /// given to new queues, so that a program making and freeing queues
    /// does not grow `queues` for ever.
    private var forgottenQueues: [QueueID] = []
    /// Submits with dependencies that wait in the runtime's inbox: slots
    /// they may name are hidden, not freed, when history drops them.
    let gate: DependencyGate
    /// Hidden slots (dropped from history while a counted submit may name
    /// them) by id: found only by the booking of such a submit.
    private var hidden: [OpID: Int32] = [:]
    /// Hidden since the last flip of the gate's phase, and before it (freed
    /// once `hiddenPhase` has drained).
    private var hiddenNew: [Int32] = []
    private var hiddenOld: [Int32] = []
    private var hiddenPhase = 0

    init(config: Config = Config(), gate: DependencyGate = DependencyGate()) {
        self.config = config
        self.gate = gate
        // A machine dropped with live operations lets their objects go.
        slab.willDeinitialize = { op in
            op.owner?.release()
            op.owner = nil
        }
    }

    /// Drops slot `s`'s reference to its owner.
    @inline(__always)
    private mutating func clearOwner(_ s: Int) {
        if let o = slots[s].owner {
            slots[s].owner = nil
            o.release()
        }
    }

    /// Gives slot `s` this owner (retained) in place of the one it had.
    private mutating func setOwnerRef(_ s: Int, _ owner: Owner?) {
        clearOwner(s)
        slots[s].owner = owner.map { Unmanaged.passRetained($0) }
    }

    // MARK: - Slots

    /// The slot of a live operation.
    @inline(__always)
    private func liveSlot(_ id: OpID) -> Int? {
        guard let s = index[id] else { return nil }
        return slots[Int(s)].state == .finished ? nil : Int(s)
    }

    /// The slot of a finished operation still remembered.
    private func finishedSlot(_ id: OpID) -> Int? {
        guard let s = index[id] else { return nil }
        return slots[Int(s)].state == .finished ? Int(s) : nil
    }

    private mutating func allocate(_ op: consuming Op) -> Int {
        if let s = freeSlots.popLast() {
            slots[Int(s)] = op
            return Int(s)
        }
        return slab.append(op)
    }

    private mutating func freeSlot(_ s: Int) {
        index.removeValue(forKey: slots[s].id)
        recycleSlot(s)
    }

    /// `freeSlot` for a slot out of `index` (hidden, see `hide`).
    private mutating func recycleSlot(_ s: Int) {
        dropLinks(s)
        // The other fields are all set again when the slot is reused.
        slots[s].id = 0
        slots[s].payload = nil
        clearOwner(s)
        freeSlots.append(Int32(s))
    }

    /// The index of slot `s`'s links in `linkTable`, made on first use.
    /// (Take it before writing `linkTable[...]`: the two are one access each.)
    private mutating func linksIndex(_ s: Int) -> Int {
        if slots[s].links >= 0 { return Int(slots[s].links) }
        let l: Int32
        if let free = freeLinks.popLast() {
            l = free
        } else {
            linkTable.append(Links())
            l = Int32(linkTable.count - 1)
        }
        slots[s].links = l
        return Int(l)
    }

    /// Gives slot `s`'s links back (emptied), if it has any.
    private mutating func dropLinks(_ s: Int) {
        let l = slots[s].links
        guard l >= 0 else { return }
        linkTable[Int(l)] = Links()
        freeLinks.append(l)
        slots[s].links = -1
    }

    /// Slot `s`'s strict and collect dependencies.
    private func dependencies(ofSlot s: Int) -> [OpID] {
        slots[s].links < 0 ? [] : linkTable[Int(slots[s].links)].dependencies
    }

    /// Whether `s` waits for the live `d` itself (not through others): looked
    /// up in the shorter of `s`'s dependencies and `d`'s dependents (100 000
    /// dependencies added one by one to one operation took 1.3 s, the list
    /// searched at each).
    private func waitsDirectly(_ s: Int, on d: Int) -> Bool {
        let mine = dependencies(ofSlot: s)
        guard slots[d].links >= 0 else { return false }
        let theirs = linkTable[Int(slots[d].links)].dependents
        if mine.count <= theirs.count { return mine.contains(slots[d].id) }
        let id = slots[s].id
        return theirs.contains { $0.id == id && $0.edge != .order }
    }

    /// Counts an operation into or out of "queued", its queue's and the
    /// engine's. An internal carrier is not counted: the callers it carries
    /// are (attached), as with a caller leading the transfer.
    private mutating func countQueued(_ q: QueueID, _ delta: Int, isInternal: Bool) {
        guard !isInternal else { return }
        queues[q].counters.queued += delta
        counters.queued += delta
    }

    private mutating func hostNumber(_ name: String) -> Int32 {
        if let h = hostIndex[ExactString(name)] { return h }
        hosts.append(Host(name: name))
        let h = Int32(hosts.count - 1)
        hostIndex[ExactString(name)] = h
        return h
    }

    private mutating func listAppend(_ s: Int, queue q: QueueID) {
        let tail = queues[q].tail
        slots[s].prev = tail
        slots[s].next = -1
        if tail >= 0 { slots[Int(tail)].next = Int32(s) } else { queues[q].head = Int32(s) }
        queues[q].tail = Int32(s)
        queues[q].unfinishedCount += 1
    }

    private mutating func listRemove(_ s: Int) {
        let q = slots[s].queue
        let prev = slots[s].prev, next = slots[s].next
        if prev >= 0 { slots[Int(prev)].next = next } else { queues[q].head = next }
        if next >= 0 { slots[Int(next)].prev = prev } else { queues[q].tail = prev }
        slots[s].prev = -1
        slots[s].next = -1
        queues[q].unfinishedCount -= 1
    }

    /// Ids of a queue's unfinished operations, newest first.
    private func unfinished(of q: QueueID) -> [OpID] {
        guard queueExists(q) else { return [] }
        var ids: [OpID] = []
        ids.reserveCapacity(queues[q].unfinishedCount)
        var s = queues[q].tail
        while s >= 0 {
            ids.append(slots[Int(s)].id)
            s = slots[Int(s)].prev
        }
        return ids
    }

    private func queueExists(_ q: QueueID) -> Bool { q > 0 && q < queues.count && !queues[q].removed }

    /// Whether the queue exists (a closed queue is forgotten once done).
    func hasQueue(_ q: QueueID) -> Bool { queueExists(q) }

    // MARK: - Queues

    /// A new queue. It takes the id of a forgotten queue that `reusable`
    /// accepts (the runtime's own state of that id is gone too), else a new
    /// one.
    mutating func addQueue(name: String, maxConcurrent: Int, reusable: (QueueID) -> Bool = { _ in false }) -> QueueID {
        let id: QueueID
        if let i = forgottenQueues.firstIndex(where: reusable) {
            id = forgottenQueues.remove(at: i)
            queues[id] = Queue(name: name, maxConcurrent: maxConcurrent)
        } else {
            queues.append(Queue(name: name, maxConcurrent: maxConcurrent))
            id = queues.count - 1
        }
        queues[id].orderAt = Int32(queueOrder.count)
        queueOrder.append(id)
        queueByName[ExactString(name)] = id
        return id
    }

    func queueNamed(_ name: String) -> QueueID? { queueByName[ExactString(name)] }

    /// Removes `q` from `activeQueues` (`active`) or `queueOrder` in O(1):
    /// the last id takes its place.
    private mutating func removeQueue(_ q: QueueID, active: Bool) {
        let i = Int(active ? queues[q].activeAt : queues[q].orderAt)
        guard i >= 0 else { return }
        if active {
            let last = activeQueues.removeLast()
            if last != q {
                activeQueues[i] = last
                queues[last].activeAt = Int32(i)
            }
            queues[q].activeAt = -1
        } else {
            let last = queueOrder.removeLast()
            if last != q {
                queueOrder[i] = last
                queues[last].orderAt = Int32(i)
            }
            queues[q].orderAt = -1
        }
    }

    private mutating func makeActive(_ q: QueueID) {
        guard queues[q].activeAt < 0 else { return }
        queues[q].activeAt = Int32(activeQueues.count)
        activeQueues.append(q)
    }

    /// `queues[q].readyCount += delta`, keeping `activeQueues` to the queues
    /// with ready operations that are not suspended.
    @inline(__always)
    private mutating func countReady(_ q: QueueID, _ delta: Int) {
        let was = queues[q].readyCount
        queues[q].readyCount = was + delta
        if was == 0 && delta > 0 {
            if !queues[q].suspended { makeActive(q) }
        } else if was + delta == 0 {
            removeQueue(q, active: true)
            // Whatever its FIFOs still hold is stale: dropped now, as
            // `schedule` no longer looks at the queue.
            queues[q].staleEntries = 0
            dropStaleEntries(q)
        }
    }

    mutating func setMaxConcurrent(_ queue: QueueID, _ n: Int, now: UInt64) -> [Action] {
        guard queueExists(queue) else { return [] }
        queues[queue].maxConcurrent = n
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return actions
    }

    mutating func setSuspended(_ queue: QueueID, _ suspended: Bool, now: UInt64) -> [Action] {
        guard queueExists(queue) else { return [] }
        queues[queue].suspended = suspended
        if suspended {
            removeQueue(queue, active: true)
        } else if queues[queue].readyCount > 0 {
            makeActive(queue)
        }
        var actions: [Action] = []
        if !suspended { schedule(now: now, into: &actions) }
        return actions
    }

    /// The queue's handle was freed: cancel what has not started, and forget
    /// the queue once its running operations are done. A running request
    /// that is retried comes back to the queue: nobody can resume it any
    /// more, so it is no longer suspended.
    mutating func closeQueue(_ queue: QueueID, now: UInt64) -> [Action] {
        guard queueExists(queue) else { return [] }
        queues[queue].closed = true
        queues[queue].suspended = false
        if queues[queue].readyCount > 0 { makeActive(queue) }
        if queueByName[ExactString(queues[queue].name)] == queue { queueByName[ExactString(queues[queue].name)] = nil }
        let notStarted = unfinished(of: queue).filter { liveSlot($0).map { slots[$0].state != .running } ?? false }
        let actions = cancelMany(notStarted, sorted: true, now: now).actions
        removeQueueIfDone(queue)
        return actions
    }

    private mutating func removeQueueIfDone(_ queue: QueueID) {
        if queues[queue].closed && !queues[queue].removed && queues[queue].unfinishedCount == 0 {
            queues[queue].removed = true
            for lane in queues[queue].lanes {
                // Only stale entries can be left (nothing of the queue is
                // live): dropped, so that the lane starts empty again.
                for r in 0..<25 { rings[Int(lane) * 25 + r] = Ring() }
                lanes[Int(lane)].mask = 0
                freeLanes.append(lane)
            }
            queues[queue].lanes = []
            queues[queue].laneByHost = []
            removeQueue(queue, active: false)
            forgottenQueues.append(queue)
        }
    }

    // MARK: - Submit

    /// Adds an operation. Fails (and changes nothing) for an unknown or
    /// closed queue, or an unknown dependency.
    mutating func submit(_ spec: Spec, now: UInt64) -> Result<(OpID, [Action]), FetchQError> {
        var actions: [Action] = []
        switch submit(spec, now: now, into: &actions) {
        case .success(let id): return .success((id, actions))
        case .failure(let error): return .failure(error)
        }
    }

    mutating func submit(_ spec: Spec, now: UInt64, into actions: inout [Action]) -> Result<OpID, FetchQError> {
        guard queueExists(spec.queue), !queues[spec.queue].closed else {
            return .failure(FetchQError(.invalid, "the queue has been freed"))
        }
        let deps = Self.unique(spec.dependsOn)
        for dep in deps where index[dep] == nil {
            return .failure(FetchQError(.notFound, Self.unknownMessage(dep, nextOpID: nextOpID, history: config.history)))
        }

        let id = spec.id ?? nextOpID
        let q = spec.queue
        let s = book(id, queue: q, group: spec.group, host: spec.host.map { hostNumber($0) } ?? 0,
                     priority: spec.priority, qos: spec.qos, isBarrier: spec.barrier, isInternal: spec.isInternal,
                     owner: spec.owner.map { .passRetained($0) })
        slots[s].isNetwork = spec.network || spec.host != nil
        slots[s].hasNetworkValue = spec.networkValue
        if spec.attached {
            slots[s].state = .attached
            return .success(id)
        }
        if let deadline = spec.startDeadline { addStartDeadline(id, deadline) }

        // Ordering edges: a barrier waits for everything before it; everything
        // after an open barrier waits for the barrier.
        if spec.barrier {
            var other = slots[s].prev
            while other >= 0 {
                link(s, after: Int(other), edge: .order)
                other = slots[Int(other)].prev
            }
            queues[q].openBarrier = id
            liveBarriers += 1
        } else if let barrier = queues[q].openBarrier,
                  let b = fence(from: liveSlot(barrier), carrying: spec.isInternal ? spec.carried : []) {
            link(s, after: b, edge: .order)
        }
        if spec.isInternal && !spec.carried.isEmpty {
            linkTable[linksIndex(s)].carried = spec.carried  // for `settle`'s re-linking
        }
        if !spec.collects.isEmpty { linkTable[linksIndex(s)].collects = spec.collects }
        for dep in spec.collects {
            if let d = liveSlot(dep) {
                link(s, after: d, edge: .collect)
            } else {
                // Already ended (e.g. at its own submit, its dependency had
                // failed): collected as it ended, or as cancelled if forgotten.
                let done = finishedSlot(dep)
                let l = linksIndex(s)
                linkTable[l].dependencyPayloads.append(
                    Dependency(id: dep, outcome: done.map { slots[$0].outcome } ?? .cancelled,
                               payload: done.flatMap { slots[$0].payload }))
            }
        }
        if let (dep, outcome) = linkDependencies(s, deps, hiddenToo: false) {
            // (each was found above: `outcome` is that of a finished one)
            end(s, .cancelled, .dependency, .dependency(dep, outcome ?? .cancelled), now: now, into: &actions)
            schedule(now: now, into: &actions)
        } else {
            if slots[s].waitingOn == 0 {
                if let notBefore = spec.notBefore, notBefore > now {
                    slots[s].state = .backoff
                    retries.insert(id, key: notBefore)
                } else {
                    makeReady(s, now: now)
                }
            }
            // Only this queue changed: if it cannot start anything, neither
            // can the others (they were settled by the last event; time-based
            // changes, aging and tokens, come through `expire`).
            if isEligible(q) { schedule(now: now, into: &actions) }
        }
        return .success(id)
    }

    /// The barrier that holds back an operation submitted after barrier slot
    /// `b`: `b` itself, or for a carrier of `carried` callers the newest live
    /// barrier from `b` back that does not wait for one of them (one that
    /// does would wait for the carrier: a deadlock; an earlier one still
    /// holds it, as it holds the callers, submitted after it).
    private func fence(from b: Int?, carrying carried: [OpID]) -> Int? {
        var b = b
        while let barrier = b, !carried.isEmpty, barrierWaits(slots[barrier].id, forAnyOf: carried) {
            b = previousLiveBarrier(barrier)
        }
        return b
    }

    /// The newest barrier submitted before slot `s` to its queue that has not
    /// ended, if any.
    private func previousLiveBarrier(_ s: Int) -> Int? {
        var other = slots[s].prev
        while other >= 0 {
            if slots[Int(other)].isBarrier { return Int(other) }
            other = slots[Int(other)].prev
        }
        return nil
    }

    /// Whether the barrier `barrier` waits for one of `ids` (it waits for
    /// everything before it in its queue: each of those lists it among its
    /// dependents).
    private func barrierWaits(_ barrier: OpID, forAnyOf ids: [OpID]) -> Bool {
        ids.contains { id in
            guard let s = liveSlot(id), slots[s].links >= 0 else { return false }
            return linkTable[Int(slots[s].links)].dependents.contains { $0.id == barrier }
        }
    }

    /// Links slot `s` after its strict dependencies (each live or
    /// remembered; with `hiddenToo` also hidden, see `hide`) and takes the
    /// results of those that have finished. Returns the first that did not
    /// succeed, if any; with `hiddenToo`, an unknown id ends the search as
    /// `(id, nil)`.
    private mutating func linkDependencies(_ s: Int, _ deps: [OpID], hiddenToo: Bool) -> (OpID, Outcome?)? {
        var failed: (OpID, Outcome?)? = nil
        for dep in deps {
            if let d = liveSlot(dep) {
                link(s, after: d, edge: .strict)
                continue
            }
            guard let done = finishedSlot(dep) ?? (hiddenToo ? hidden[dep].map { Int($0) } : nil) else {
                if failed == nil { failed = (dep, nil) }
                continue
            }
            let l = linksIndex(s)
            linkTable[l].dependencies.append(dep)
            if slots[done].outcome == .succeeded {
                linkTable[l].dependencyPayloads.append(Dependency(id: dep, outcome: .succeeded, payload: slots[done].payload))
            } else if failed == nil {
                failed = (dep, slots[done].outcome)
            }
        }
        return failed
    }

    /// `submit` for what the runtime's inbox holds: an operation with no
    /// host, collect, barrier or attachment, and its own id. The same
    /// booking without building a `Spec`. False (nothing booked) for an
    /// unknown or closed queue.
    ///
    /// `dependsOn`: ids the submit found remembered when it passed the gate
    /// (`DependencyGate.enter`); those history dropped since are still
    /// found (hidden). One that was never booked (a guess at an id whose
    /// submit failed) ends the operation with FQ_ERR_NOT_FOUND.
    ///
    /// `adopting`: the owner with a reference taken for the slot, which
    /// keeps it (a refused submit leaves it to the caller).
    mutating func submitPlain(id: OpID, queue q: QueueID, priority: Priority, qos: QoS, group: String?,
                              startDeadline: UInt64?, dependsOn: [OpID] = [], adopting owner: Unmanaged<Owner>,
                              now: UInt64, into actions: inout [Action]) -> Bool {
        guard queueExists(q), !queues[q].closed else {
            // Its submit returned before the queue closed (the inbox checks
            // that); the runtime ends it cancelled, and the counters say so.
            counters.submitted += 1
            counters.cancelled += 1
            if queueExists(q) {
                queues[q].counters.submitted += 1
                queues[q].counters.cancelled += 1
            }
            return false
        }
        let s = book(id, queue: q, group: group, host: 0, priority: priority, qos: qos, isBarrier: false,
                     isInternal: false, owner: owner)
        if let startDeadline { addStartDeadline(id, startDeadline) }
        if let barrier = queues[q].openBarrier, let b = liveSlot(barrier) { link(s, after: b, edge: .order) }
        if !dependsOn.isEmpty, let (dep, outcome) = linkDependencies(s, Self.unique(dependsOn), hiddenToo: true) {
            if let outcome {
                end(s, .cancelled, .dependency, .dependency(dep, outcome), now: now, into: &actions)
            } else {
                end(s, .cancelled, .notFound, .text("no operation \(dep)"), now: now, into: &actions)
            }
            schedule(now: now, into: &actions)
            return true
        }
        if slots[s].waitingOn == 0 { makeReady(s, now: now) }
        if isEligible(q) { schedule(now: now, into: &actions) }
        return true
    }

    /// `ids` without repeats, in order (an id may appear more than once in
    /// "depends_on"; it counts once).
    private static func unique(_ ids: [OpID]) -> [OpID] {
        guard ids.count > 1 else { return ids }
        var seen = Set<OpID>()
        return ids.filter { seen.insert($0).inserted }
    }

    /// Gives a new operation its slot and counts it (waiting, no edges yet).
    /// The slot adopts `owner`, a reference taken for it.
    private mutating func book(_ id: OpID, queue q: QueueID, group: String?, host: Int32, priority: Priority, qos: QoS,
                               isBarrier: Bool, isInternal: Bool, owner: Unmanaged<Owner>?) -> Int {
        nextOpID = max(nextOpID, id + 1)
        nextSeq += 1
        let s = allocate(Op(id: id, queue: q, seq: nextSeq, host: host,
                            level: Int8(priority.level), qos: Int8(qos.rawValue),
                            isBarrier: isBarrier, isInternal: isInternal))
        slots[s].owner = owner  // a new or freed slot holds none
        slots[s].firstLevel = slots[s].level
        index.insert(id, Int32(s))
        liveCount += 1
        listAppend(s, queue: q)
        if !isInternal {
            queues[q].counters.submitted += 1
            counters.submitted += 1
        }
        countQueued(q, 1, isInternal: isInternal)
        if let group {
            let l = linksIndex(s)
            linkTable[l].group = group
            groups[ExactString(group), default: []].insert(id)
        }
        return s
    }

    private static func unknownMessage(_ dep: OpID, nextOpID: OpID, history: Int) -> String {
        if dep > 0 && dep < nextOpID {
            return "operation \(dep) finished longer ago than the engine remembers (config \"history\": \(history))"
        }
        return "no operation \(dep)"
    }

    /// Slot `s` waits for slot `d`.
    private mutating func link(_ s: Int, after d: Int, edge: Edge) {
        let ld = linksIndex(d)
        linkTable[ld].dependents.append(Dependent(id: slots[s].id, edge: edge))
        slots[s].waitingOn += 1
        if edge != .order {
            let ls = linksIndex(s)
            linkTable[ls].dependencies.append(slots[d].id)
        }
    }

    // MARK: - Dependencies added later

    /// Makes `id` also wait for `dep` (NSOperation.addDependency).
    mutating func addDependency(_ id: OpID, on dep: OpID, now: UInt64) -> Result<[Action], FetchQError> {
        guard let s = liveSlot(id) else {
            return .failure(FetchQError(.notFound, "no unfinished operation \(id)"))
        }
        let state = slots[s].state
        guard state == .waiting || state == .ready else {
            if state == .attached {
                return .failure(FetchQError(.state, "operation \(id) shares another operation's transfer (option \"coalesce\"): it cannot be given a dependency; submit it with \"depends_on\", or with \"coalesce\": false"))
            }
            return .failure(FetchQError(.state, "operation \(id) has already started"))
        }
        if dep == id {
            return .failure(FetchQError(.cycle, "operation \(id) cannot depend on itself"))
        }
        if let d = liveSlot(dep) {
            if waits(dep, on: id) {
                return .failure(FetchQError(.cycle, "operation \(dep) already waits for \(id): the dependency would create a cycle"))
            }
            if waitsDirectly(s, on: d) { return .success([]) }
            // A search-all's queries not sent yet wait too, as with its
            // "depends_on" (only the merge waited: the ninth review's check
            // of the docs).
            let queries = unstartedQueries(ofSlot: s).filter { $0 != dep && !dependencies(ofSlot: liveSlot($0)!).contains(dep) }
            for query in queries where waits(dep, on: query) {
                return .failure(FetchQError(.cycle, "operation \(dep) already waits for \(query), a query of search-all \(id): the dependency would create a cycle"))
            }
            link(s, after: d, edge: .strict)
            if state == .ready { unready(s) }
            for query in queries {
                let q = liveSlot(query)!
                let was = slots[q].state
                link(q, after: d, edge: .strict)
                if was == .ready { unready(q) }
            }
            return .success([])
        }
        guard let done = finishedSlot(dep) else {
            return .failure(FetchQError(.notFound, Self.unknownMessage(dep, nextOpID: nextOpID, history: config.history)))
        }
        // (Given twice, it counts once: listed twice, `removeDependency`
        // found it again after removing it.)
        if dependencies(ofSlot: s).contains(dep) { return .success([]) }
        var actions: [Action] = []
        let l = linksIndex(s)
        linkTable[l].dependencies.append(dep)
        if slots[done].outcome == .succeeded {
            linkTable[l].dependencyPayloads.append(Dependency(id: dep, outcome: .succeeded, payload: slots[done].payload))
        } else {
            end(s, .cancelled, .dependency, .dependency(dep, slots[done].outcome), now: now, into: &actions)
            schedule(now: now, into: &actions)
        }
        return .success(actions)
    }

    /// A search-all's queries (the operations slot `s` collects) that have
    /// not started: live, waiting or ready.
    private func unstartedQueries(ofSlot s: Int) -> [OpID] {
        guard slots[s].links >= 0 else { return [] }
        return linkTable[Int(slots[s].links)].collects.filter {
            guard let q = liveSlot($0) else { return false }
            return slots[q].state == .waiting || slots[q].state == .ready
        }
    }

    /// ``unstartedQueries(ofSlot:)`` of operation `id` (none for any other).
    func unstartedQueries(of id: OpID) -> [OpID] {
        liveSlot(id).map(unstartedQueries(ofSlot:)) ?? []
    }

    /// Makes `id` no longer wait for `dep` (NSOperation.removeDependency):
    /// a dependency given with "depends_on" or `addDependency`, unfinished
    /// or finished (then its result is no longer passed to `id`). An
    /// operation left waiting for nothing is ready, from now, behind those
    /// ready before it. For a search-all, its queries that wait for `dep`
    /// (they were submitted with its "depends_on") no longer do either. A
    /// barrier's wait and a search-all's queries are not dependencies that
    /// can be removed.
    mutating func removeDependency(_ id: OpID, on dep: OpID, now: UInt64) -> Result<[Action], FetchQError> {
        guard let s = liveSlot(id) else {
            if finishedSlot(id) != nil {
                return .failure(FetchQError(.state, "operation \(id) has already finished"))
            }
            return .failure(FetchQError(.notFound, Self.unknownMessage(id, nextOpID: nextOpID, history: config.history)))
        }
        let state = slots[s].state
        guard state == .waiting || state == .ready else {
            if state == .attached {
                return .failure(FetchQError(.state, "operation \(id) shares another operation's transfer (option \"coalesce\"): it has no dependencies of its own"))
            }
            return .failure(FetchQError(.state, "operation \(id) has already started"))
        }
        let l = slots[s].links
        guard l >= 0, linkTable[Int(l)].dependencies.contains(dep) else {
            if let d = liveSlot(dep), slots[d].links >= 0,
               linkTable[Int(slots[d].links)].dependents.contains(where: { $0.id == id && $0.edge == .order }) {
                let why = slots[d].isBarrier ? "\(dep) is a barrier of its queue" : "\(id) is a barrier of its queue"
                return .failure(FetchQError(.state, "operation \(id) waits for operation \(dep) because \(why): a barrier's wait cannot be removed"))
            }
            if liveSlot(dep) != nil, waits(id, on: dep) {
                // (Through a barrier behind `dep`, or another dependency:
                // the ninth review's model tester.)
                return .failure(FetchQError(.state, "operation \(id) waits for operation \(dep) only through others (a barrier, or a dependency of a dependency): that wait cannot be removed from \(id)"))
            }
            return .failure(FetchQError(.notFound, "operation \(id) does not depend on operation \(dep)"))
        }
        let queries = linkTable[Int(l)].collects
        if queries.contains(dep) {
            return .failure(FetchQError(.state, "operation \(dep) is a query of search-all \(id): it cannot be removed"))
        }
        var readied = false
        for query in queries {
            if let q = liveSlot(query), slots[q].state == .waiting { readied = unlink(q, from: dep, now: now) || readied }
        }
        readied = unlink(s, from: dep, now: now) || readied
        var actions: [Action] = []
        if readied { schedule(now: now, into: &actions) }
        return .success(actions)
    }

    /// Removes the strict edge from slot `s` (waiting or ready) to `dep`, if
    /// it has one; true when that made it ready.
    private mutating func unlink(_ s: Int, from dep: OpID, now: UInt64) -> Bool {
        guard slots[s].links >= 0 else { return false }
        let l = Int(slots[s].links)
        guard let at = linkTable[l].dependencies.firstIndex(of: dep) else { return false }
        linkTable[l].dependencies.remove(at: at)
        guard let d = liveSlot(dep) else {
            // Finished (it succeeded, or `s` would have ended with it): its
            // result is no longer handed over.
            linkTable[l].dependencyPayloads.removeAll { $0.id == dep }
            return false
        }
        let ld = Int(slots[d].links)  // (`link` made one)
        guard let edge = linkTable[ld].dependents.firstIndex(where: { $0.id == slots[s].id && $0.edge == .strict }) else {
            return false
        }
        linkTable[ld].dependents.remove(at: edge)
        slots[s].waitingOn -= 1
        guard slots[s].waitingOn == 0 && slots[s].state == .waiting else { return false }
        readyAfterWaiting(s, now: now)
        return true
    }

    /// Whether `waiter` waits, directly or through others, for `target`.
    /// From `target` along the edges to what waits for it (each live
    /// operation's dependents), which hold every kind of wait, a barrier's
    /// included (it waits for everything before it in its queue, and what
    /// comes after it waits for it). With no barrier live, `dependencies`
    /// lists every wait too, so the walk also goes from `waiter` along what
    /// it waits for, a step on each side in turn: the side that runs out
    /// first answers, at the cost of the smaller one (a chain built from its
    /// far end made every call walk the whole chain: 20 000 links took 8.6 s).
    private func waits(_ waiter: OpID, on target: OpID) -> Bool {
        var ahead = [target], behind = [waiter]
        var waitsForTarget: Set<OpID> = [target], waiterWaitsFor: Set<OpID> = [waiter]
        let bothWays = liveBarriers == 0
        while let current = ahead.popLast() {
            if let s = liveSlot(current), slots[s].links >= 0 {
                for dependent in linkTable[Int(slots[s].links)].dependents where liveSlot(dependent.id) != nil {
                    if waiterWaitsFor.contains(dependent.id) { return true }
                    if waitsForTarget.insert(dependent.id).inserted { ahead.append(dependent.id) }
                }
            }
            guard bothWays else { continue }
            guard let other = behind.popLast() else { return false }
            if let s = liveSlot(other), slots[s].links >= 0 {
                for dep in linkTable[Int(slots[s].links)].dependencies where liveSlot(dep) != nil {
                    if waitsForTarget.contains(dep) { return true }
                    if waiterWaitsFor.insert(dep).inserted { behind.append(dep) }
                }
            }
        }
        return false
    }

    // MARK: - Priority

    mutating func setPriority(_ id: OpID, _ priority: Priority, now: UInt64) -> Result<[Action], FetchQError> {
        guard let s = liveSlot(id) else {
            return .failure(FetchQError(.notFound, "no unfinished operation \(id)"))
        }
        guard slots[s].state != .running else {
            return .failure(FetchQError(.state, "operation \(id) has already started"))
        }
        guard Int(slots[s].level) != priority.level else { return .success([]) }
        slots[s].level = Int8(priority.level)
        // Back at its first level its old entry is valid again (its old place,
        // if still there); at another, a fresh sequence number puts it behind
        // those waiting there, an entry of an earlier visit included. The
        // same while it waits for a dependency it was submitted with: its
        // entry, made when it becomes ready, carries that number.
        if slots[s].level != slots[s].firstLevel {
            nextSeq += 1
            linkTable[linksIndex(s)].movedSeq = nextSeq
        }
        if slots[s].state == .ready {
            // The old FIFO entry goes stale (its level no longer matches).
            enqueueReady(s)
            noteStale(slots[s].queue)
        }
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return .success(actions)
    }

    // MARK: - Cancellation

    /// Cancels one operation. Not started: it ends now. Running: the runtime
    /// is told to abort it; it ends when the runtime reports `finished`.
    mutating func cancel(_ id: OpID, now: UInt64) -> Result<[Action], FetchQError> {
        guard let s = liveSlot(id) else {
            // Cancelling twice is harmless, while the operation is remembered.
            if let f = finishedSlot(id) {
                if slots[f].cancelledByOwn { return .success([]) }
                return .failure(FetchQError(.notFound, "operation \(id) has already finished"))
            }
            return .failure(FetchQError(.notFound, "no operation \(id)"))
        }
        var actions: [Action] = []
        cancelOne(s, now: now, into: &actions)
        schedule(now: now, into: &actions)
        return .success(actions)
    }

    mutating func cancelGroup(_ group: String, now: UInt64) -> (count: Int, actions: [Action]) {
        cancelMany(groups[ExactString(group)].map { Array($0) } ?? [], sorted: false, now: now)
    }

    mutating func cancelAll(now: UInt64) -> (count: Int, actions: [Action]) {
        let open = queueOrder
        if open.count == 1 { return cancelMany(unfinished(of: open[0]), sorted: true, now: now) }
        return cancelMany(open.flatMap { unfinished(of: $0) }, sorted: false, now: now)
    }

    mutating func cancelQueue(_ queue: QueueID, now: UInt64) -> (count: Int, actions: [Action]) {
        cancelMany(unfinished(of: queue), sorted: true, now: now)
    }

    /// `sorted`: `ids` are already newest first.
    private mutating func cancelMany(_ ids: [OpID], sorted: Bool, now: UInt64) -> (count: Int, actions: [Action]) {
        var actions: [Action] = []
        actions.reserveCapacity(ids.count)
        var count = 0
        // Every target not yet started is marked ended before any of them
        // settles its dependents: each then reports its own cancellation,
        // not its dependency's failure, and is counted, whichever way its
        // dependencies point (fq_add_dependency can make an older
        // operation wait for a newer one, which the newest-first order
        // alone got wrong: the eleventh review's mutation testing).
        // Highest id first, for the order of the callbacks.
        var ended: [Int] = []
        for id in sorted ? ids : ids.sorted(by: >) {
            guard let s = liveSlot(id), !slots[s].cancelRequested else { continue }
            count += 1
            let state = slots[s].state
            if state == .running || state == .attached {
                cancelOne(s, now: now, into: &actions)
            } else if markEnded(s, .cancelled, .cancelled, .cancelled, into: &actions) {
                ended.append(s)
            }
        }
        for s in ended {
            retire(s, .cancelled, nil, byCancel: true, now: now, into: &actions)
        }
        schedule(now: now, into: &actions)
        return (count, actions)
    }

    /// A queue with nothing ready holds only stale FIFO entries (cancelled
    /// while ready): `countReady` drops them as the count reaches 0, rather
    /// than when the queue next starts something, so a cancel-all of a
    /// large backlog gives its memory back.
    private mutating func dropStaleEntries(_ q: QueueID) {
        for lane in queues[q].lanes where lanes[Int(lane)].mask != 0 {
            for slot in 0..<25 where !rings[Int(lane) * 25 + slot].isEmpty {
                rings[Int(lane) * 25 + slot] = Ring()
            }
            lanes[Int(lane)].mask = 0
        }
        releaseEmptyLanes(of: q)
    }

    /// A network host's lane whose FIFOs are all empty leaves its queue (to
    /// `freeLanes`, for the next lane anyone needs): a queue that sent to
    /// many hosts kept a lane (25 FIFOs) for each for good, and looked at
    /// every one of them at each start, so it got slower with every host.
    /// The lane of host 0 (block and async operations) stays.
    private mutating func releaseEmptyLanes(of q: QueueID) {
        var i = 0
        while i < queues[q].lanes.count {
            let lane = Int(queues[q].lanes[i])
            guard lanes[lane].mask == 0 && lanes[lane].host != 0 else {
                i += 1
                continue
            }
            queues[q].laneByHost[Int(lanes[lane].host)] = -1
            freeLanes.append(Int32(lane))
            queues[q].lanes.swapAt(i, queues[q].lanes.count - 1)
            queues[q].lanes.removeLast()
        }
    }

    /// Entries in the ready FIFOs, stale ones included (for tests).
    var readyEntries: Int { rings.reduce(0) { $0 + $1.count } }

    /// `linkTable`'s length, entries in use and free (for tests).
    var linkEntries: Int { linkTable.count }

    private mutating func cancelOne(_ s: Int, now: UInt64, into actions: inout [Action]) {
        guard !slots[s].cancelRequested else { return }
        let state = slots[s].state
        if state == .running || state == .attached {
            slots[s].cancelRequested = true
            actions.append(.cancelRunning(slots[s].id))
        } else {
            end(s, .cancelled, .cancelled, .cancelled, now: now, into: &actions)
        }
    }

    // MARK: - Completion

    /// The runtime reports that a running operation ended.
    mutating func finished(_ id: OpID, _ outcome: Outcome, payload: Payload?, now: UInt64) -> [Action] {
        var actions: [Action] = []
        finished(id, outcome, payload: payload, now: now, into: &actions)
        return actions
    }

    mutating func finished(_ id: OpID, _ outcome: Outcome, payload: Payload?, now: UInt64,
                           into actions: inout [Action]) {
        guard let s = runningSlot(id) else { return }
        finished(slot: s, outcome, payload: payload, now: now, into: &actions)
    }

    /// Where a running or attached operation is, for `finished(slot:)`
    /// (valid until the scheduler next changes): nil when it is not.
    func runningSlot(_ id: OpID) -> Int? {
        guard let s = liveSlot(id), slots[s].state == .running || slots[s].state == .attached else { return nil }
        return s
    }

    /// `finished` for the operation `runningSlot` found (one lookup).
    mutating func finished(slot s: Int, _ outcome: Outcome, payload: Payload?, now: UInt64,
                           into actions: inout [Action]) {
        let state = slots[s].state
        let q = slots[s].queue
        if state == .attached {
            countQueued(q, -1, isInternal: false)  // a caller, never internal
        } else {
            queues[q].counters.running -= 1
            counters.running -= 1
            if slots[s].host != 0 { hosts[Int(slots[s].host)].running -= 1 }  // as counted at the start
            if slots[s].isInternal { noteInternalRunning(q, -1) }
        }
        retire(s, outcome, payload, byCancel: outcome == .cancelled && slots[s].cancelRequested, now: now, into: &actions)
        schedule(now: now, into: &actions)
    }

    /// Ends an operation that has not started, and everything that strictly
    /// depends on it.
    private mutating func end(_ s: Int, _ outcome: Outcome, _ status: FQStatus, _ reason: EndReason,
                              now: UInt64, into actions: inout [Action]) {
        if markEnded(s, outcome, status, reason, into: &actions) {
            retire(s, outcome, nil, byCancel: status == .cancelled, now: now, into: &actions)
        }
    }

    /// Counts a not-started operation as ended and emits its completion.
    private mutating func markEnded(_ s: Int, _ outcome: Outcome, _ status: FQStatus, _ reason: EndReason,
                                    into actions: inout [Action]) -> Bool {
        let state = slots[s].state
        guard state != .running, state != .attached, state != .finished else { return false }
        let q = slots[s].queue
        if state == .ready { countReady(q, -1) }
        countQueued(q, -1, isInternal: slots[s].isInternal)
        // No longer live from here on: `retire` books it (a cascade must
        // not end it twice through a second failed dependency).
        slots[s].state = .finished
        slots[s].outcome = outcome
        actions.append(.complete(slots[s].id, outcome, status, reason, slots[s].owner?.takeUnretainedValue()))
        return true
    }

    /// Books ended operations as finished and settles their dependents.
    /// Iterative, so a long chain of failures cannot overflow the stack.
    private mutating func retire(_ first: Int, _ outcome: Outcome, _ payload: Payload?, byCancel: Bool,
                                 now: UInt64, into actions: inout [Action]) {
        if slots[first].links < 0 {
            // No group and nothing waits for it (most operations): no cascade.
            let q = slots[first].queue
            _ = settle(first, outcome, payload, byCancel: byCancel)
            removeQueueIfDone(q)
            return
        }
        var pending: [(Int, Outcome, Payload?, Bool)] = []
        var current: (Int, Outcome, Payload?, Bool)? = (first, outcome, payload, byCancel)
        while let (s, outcome, payload, byCancel) = current {
            current = pending.popLast()
            let id = slots[s].id
            let q = slots[s].queue
            let dependents = settle(s, outcome, payload, byCancel: byCancel)
            for dependent in dependents {
                guard let d = liveSlot(dependent.id) else { continue }
                if dependent.edge == .strict && outcome != .succeeded {
                    if markEnded(d, .cancelled, .dependency, .dependency(id, outcome), into: &actions) {
                        if current == nil { current = (d, .cancelled, nil, false) } else { pending.append((d, .cancelled, nil, false)) }
                    }
                    continue
                }
                if dependent.edge != .order {
                    let ld = linksIndex(d)
                    linkTable[ld].dependencyPayloads.append(Dependency(id: id, outcome: outcome, payload: payload))
                }
                slots[d].waitingOn -= 1
                if slots[d].waitingOn == 0 && slots[d].state == .waiting {
                    readyAfterWaiting(d, now: now)
                }
            }
            removeQueueIfDone(q)
        }
    }

    /// `retire` for one operation: books it as finished (counts, group,
    /// history) and returns what waited for it, for the caller to settle.
    private mutating func settle(_ s: Int, _ outcome: Outcome, _ payload: Payload?, byCancel: Bool) -> [Dependent] {
        let id = slots[s].id
        let q = slots[s].queue
        // A barrier that ends while an earlier one is pending (it was
        // cancelled, or timed out, before it could run): what it held back
        // is held by that one again (found before `listRemove`).
        let earlierBarrier = slots[s].isBarrier ? previousLiveBarrier(s) : nil
        listRemove(s)
        liveCount -= 1
        if !restarted.isEmpty { restarted.remove(id) }
        if !slots[s].isInternal {
            queues[q].counters.count(outcome)
            counters.count(outcome)
        }
        if queues[q].openBarrier == id { queues[q].openBarrier = earlierBarrier.map { slots[$0].id } }
        if slots[s].isBarrier { liveBarriers -= 1 }
        var dependents: [Dependent] = []
        if slots[s].links >= 0 {
            let l = Int(slots[s].links)
            if let group = linkTable[l].group {
                let key = ExactString(group)
                groups[key]?.remove(id)
                if groups[key]?.isEmpty == true { groups[key] = nil }
            }
            swap(&dependents, &linkTable[l].dependents)
            dropLinks(s)
        }
        if let earlier = earlierBarrier {
            for dependent in dependents where dependent.edge == .order {
                // (A later barrier waits for the earlier one already.)
                guard let d = liveSlot(dependent.id), slots[d].state == .waiting, !slots[d].isBarrier,
                      let b = fence(from: earlier, carrying: slots[d].links >= 0 ? linkTable[Int(slots[d].links)].carried : [])
                else { continue }
                link(d, after: b, edge: .order)
            }
        }
        // A network operation's value: its own transfer (or the cache's
        // answer) or a shared one (it was attached to a carrier).
        let networkValue = slots[s].isNetwork || slots[s].state == .attached || slots[s].hasNetworkValue
        slots[s].state = .finished
        slots[s].outcome = outcome
        slots[s].cancelledByOwn = byCancel
        clearOwner(s)
        // Internal operations (carriers) cannot be named in depends_on.
        remember(s, outcome == .succeeded && !slots[s].isInternal ? payload : nil, large: networkValue)
        if !hiddenOld.isEmpty || !hiddenNew.isEmpty { freeHidden() }
        return dependents
    }

    /// Keeps a finished operation for `history` more finishes (its value
    /// too, except network values beyond the newest `historyValues`).
    private mutating func remember(_ s: Int, _ payload: Payload?, large: Bool) {
        guard config.history > 0 else {
            if gate.forget(slots[s].id) {
                if let payload { released.append(payload) }
                freeSlot(s)
            } else {
                slots[s].payload = payload
                hide(s)
            }
            return
        }
        if let payload {
            if !large {
                slots[s].payloadIsLight = config.isLight(payload)
                slots[s].payload = payload
            } else if config.historyValues > 0 {
                slots[s].payload = config.historyForm(payload)
                valueOrder.append(Entry(id: slots[s].id, slot: Int32(s)))
                while valueOrder.count > config.historyValues {
                    let old = valueOrder.removeFirst()
                    let o = Int(old.slot)
                    if slots[o].id == old.id, let value = slots[o].payload.take() {
                        released.append(value)
                    }
                }
            } else {
                released.append(payload)
            }
        }
        historyOrder.append(Int32(s))
        while historyOrder.count > config.history {
            let old = Int(historyOrder.removeFirst())
            guard gate.forget(slots[old].id) else {
                hide(old)
                continue
            }
            // Moved out, not copied: released after the lock, not here.
            if let value = slots[old].payload.take() {
                if slots[old].payloadIsLight { dropped = value } else { released.append(value) }
            }
            freeSlot(old)
        }
    }

    /// History dropped slot `s` while a submit the gate counted may name
    /// it: nobody finds it from now on but that submit's booking, and it is
    /// freed once every such submit is booked (`freeHidden`).
    private mutating func hide(_ s: Int) {
        let id = slots[s].id
        index.removeValue(forKey: id)
        hidden[id] = Int32(s)
        hiddenNew.append(Int32(s))
    }

    /// Frees the hidden slots that no counted submit can name any more:
    /// those hidden before the gate's last flip once its old phase has
    /// drained; then flips again for those hidden since. Called after
    /// booking submits that passed the gate (and by `settle`).
    mutating func freeHidden() {
        while true {
            if !hiddenOld.isEmpty {
                guard gate.drained(hiddenPhase) else { return }
                for s in hiddenOld {
                    let slot = Int(s)
                    hidden.removeValue(forKey: slots[slot].id)
                    if let value = slots[slot].payload.take() { released.append(value) }
                    recycleSlot(slot)
                }
                hiddenOld.removeAll(keepingCapacity: true)
            }
            guard !hiddenNew.isEmpty else { return }
            hiddenPhase = gate.flip()
            swap(&hiddenOld, &hiddenNew)
        }
    }

    /// Hidden slots not yet freed (for the tests).
    var hiddenCount: Int { hidden.count }

    /// Hands over the light payload last dropped from history, if any.
    mutating func takeDropped() -> Payload? {
        guard dropped != nil else { return nil }
        defer { dropped = nil }
        return dropped
    }

    /// Hands over the values dropped from history (see `released`).
    mutating func takeReleased() -> [Payload] {
        guard !released.isEmpty else { return [] }
        defer { released = [] }
        return released
    }

    // MARK: - Ready queues

    /// `makeReady` for an operation whose last dependency ended (or was
    /// removed): it became ready now, so it goes behind those ready before
    /// it, in its lane and across its queue's lanes, which are compared by
    /// sequence number. (It kept its submit's: one to another host went
    /// ahead of operations ready long before it: the ninth review.)
    /// Its first level's place is taken now too, so that moved back there
    /// later (`setPriority`) it is behind those ready before it there (its
    /// submit's place put it ahead of them: the model tester).
    private mutating func readyAfterWaiting(_ s: Int, now: UInt64) {
        nextSeq += 1
        slots[s].seq = nextSeq
        if slots[s].level != slots[s].firstLevel { linkTable[linksIndex(s)].movedSeq = nextSeq }
        makeReady(s, now: now)
    }

    private mutating func makeReady(_ s: Int, now: UInt64) {
        slots[s].state = .ready
        slots[s].readySince = now
        countReady(slots[s].queue, 1)
        enqueueReady(s)
    }

    /// Appends the operation to its lane's FIFO for its level and QoS.
    private mutating func enqueueReady(_ s: Int) {
        let q = slots[s].queue
        let host = Int(slots[s].host)
        if queues[q].laneByHost.count <= host {
            queues[q].laneByHost += [Int32](repeating: -1, count: host + 1 - queues[q].laneByHost.count)
        }
        var lane = Int(queues[q].laneByHost[host])
        if lane < 0 {
            if let free = freeLanes.popLast() {
                lane = Int(free)
                lanes[lane] = Lane(queue: q, host: Int32(host))
            } else {
                lanes.append(Lane(queue: q, host: Int32(host)))
                rings += [Ring<ReadyEntry>](repeating: Ring(), count: 25)
                lane = lanes.count - 1
            }
            queues[q].laneByHost[host] = Int32(lane)
            queues[q].lanes.append(Int32(lane))
        }
        let slot = Lane.slot(level: Int(slots[s].level), qos: Int(slots[s].qos))
        rings[lane * 25 + slot].append(ReadyEntry(id: slots[s].id, seq: entrySeq(s), readySince: slots[s].readySince,
                                                  slot: Int32(s)))
        lanes[lane].mask |= 1 << UInt32(slot)
    }

    /// The sequence number the FIFO entry of slot `s` carries at its
    /// current level (see `Op.firstLevel`).
    @inline(__always)
    private func entrySeq(_ s: Int) -> UInt64 {
        slots[s].level == slots[s].firstLevel ? slots[s].seq : linkTable[Int(slots[s].links)].movedSeq
    }

    /// Whether a FIFO entry in ring `r` (of any lane) is slot `s`'s place
    /// now: its operation is ready, at that level, with that sequence number.
    @inline(__always)
    private func isCurrent(_ entry: ReadyEntry, ring r: Int) -> Bool {
        let s = Int(entry.slot)
        return slots[s].id == entry.id && slots[s].state == .ready && Int(slots[s].level) == r % 25 / 5
            && entry.seq == entrySeq(s)
    }

    /// A ready operation given a dependency (`addDependency`) waits again. It gives up
    /// its place: ready again, it joins its level behind those ready before it and ages
    /// from then, as an operation submitted with "depends_on" does. (Its old entry used
    /// to become valid again when it still was in the FIFO, which depended on whether any
    /// other operation of the queue had been ready meanwhile; and it carried the old
    /// `readySince`, so the operation had aged while it waited: the seventh review.) Its
    /// level now counts as its first (`Op.firstLevel`).
    private mutating func unready(_ s: Int) {
        slots[s].state = .waiting  // its FIFO entries go stale, for good:
        nextSeq += 1
        slots[s].seq = nextSeq
        slots[s].firstLevel = slots[s].level
        countReady(slots[s].queue, -1)
        noteStale(slots[s].queue)
    }

    /// A FIFO entry of `q` went stale. Stale entries are dropped when they
    /// reach the front, or all at once when nothing is ready; a queue that
    /// always has something ready (an operation's priority changed again
    /// and again) compacts its FIFOs once they hold more stale entries than
    /// ready ones: each ready operation keeps one entry per level it has
    /// been at (its old place, should it come back), the rest goes.
    private mutating func noteStale(_ q: QueueID) {
        queues[q].staleEntries += 1
        guard queues[q].staleEntries > queues[q].readyCount + 1024 else { return }
        queues[q].staleEntries = 0
        var seen = Set<SIMD2<Int64>>()  // (id, FIFO): one entry each
        for lane in queues[q].lanes {
            for slot in 0..<25 {
                let r = Int(lane) * 25 + slot
                guard !rings[r].isEmpty else { continue }
                var kept = Ring<ReadyEntry>()
                while let entry = rings[r].first {
                    rings[r].removeFirst()
                    // Its entry at its first level stays while it is elsewhere:
                    // moved back there, the operation takes its old place again.
                    let s = Int(entry.slot)
                    let firstPlace = slots[s].id == entry.id && slots[s].state == .ready
                        && Int(slots[s].firstLevel) == r % 25 / 5 && entry.seq == slots[s].seq
                    if (firstPlace || isCurrent(entry, ring: r)) && seen.insert(SIMD2(entry.id, Int64(r))).inserted {
                        kept.append(entry)
                    }
                }
                rings[r] = kept
                if kept.isEmpty { lanes[Int(lane)].mask &= ~(1 << UInt32(slot)) }
            }
        }
        releaseEmptyLanes(of: q)
    }

    private struct Candidate {
        var slot: Int
        var id: OpID
        var queue: QueueID
        /// rings[] index of its FIFO.
        var ring: Int
        var lane: Int
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

    private mutating func hasCapacity(_ host: Int, now: UInt64) -> Bool {
        if host == 0 { return true }
        guard hosts[host].running < config.maxPerHost else { return false }
        if !hosts[host].bucketMade {
            hosts[host].bucketMade = true
            hosts[host].bucket = makeBucket(for: hosts[host].name, now: now)
        }
        guard hosts[host].bucket != nil else { return true }
        hosts[host].bucket!.refill(now)
        if hosts[host].bucket!.tokens >= 1 { return true }
        let wake = hosts[host].bucket!.nextToken()
        rateWake = min(rateWake ?? wake, wake)
        return false
    }

    /// A host's token bucket from the configured limit for "host:port",
    /// else "host", else "*"; nil when unlimited.
    private func makeBucket(for host: String, now: UInt64) -> Bucket? {
        let bare = host.hasPrefix("[") ? String(host.prefix(through: host.firstIndex(of: "]") ?? host.startIndex))
                                       : String(host.split(separator: ":").first ?? Substring(host))
        guard let limit = config.rateLimits[host] ?? config.rateLimits[bare] ?? config.rateLimits["*"] else { return nil }
        return Bucket(limit: limit, tokens: limit.burst, refilledAt: now)
    }

    /// The best ready operation of a queue whose host has capacity.
    /// Compares the FIFO heads by their entries alone, then checks that the
    /// winner is still ready at that level (a cancel or a new priority
    /// leaves a stale entry behind): a stale winner is dropped and the
    /// choice made again.
    private mutating func bestCandidate(in q: QueueID, now: UInt64) -> Candidate? {
        var emptied = false  // a network lane's FIFOs all went empty
        defer { if emptied { releaseEmptyLanes(of: q) } }
        while true {
            var best: Candidate? = nil
            let laneCount = queues[q].lanes.count
            for i in 0..<laneCount {
                let lane = Int(queues[q].lanes[i])
                guard lanes[lane].mask != 0, hasCapacity(Int(lanes[lane].host), now: now) else { continue }
                var bits = lanes[lane].mask
                while bits != 0 {
                    let slot = 31 - bits.leadingZeroBitCount  // highest (level, QoS) first
                    bits &= ~(1 << UInt32(slot))
                    let r = lane * 25 + slot
                    guard let entry = rings[r].first else {
                        lanes[lane].mask &= ~(1 << UInt32(slot))
                        emptied = emptied || (lanes[lane].mask == 0 && lanes[lane].host != 0)
                        continue
                    }
                    let since = entry.readySince
                    let boost = config.agingNanos == 0 || now <= since ? 0 : (now - since) / config.agingNanos
                    let candidate = Candidate(slot: Int(entry.slot), id: entry.id, queue: q, ring: r, lane: lane,
                                              effective: UInt64(slot / 5) &+ boost, qos: slot % 5, seq: entry.seq)
                    if best == nil || candidate.beatsInQueue(best!) { best = candidate }
                }
            }
            guard let chosen = best else { return nil }
            if let entry = rings[chosen.ring].first, isCurrent(entry, ring: chosen.ring) { return chosen }
            rings[chosen.ring].removeFirst()  // stale
            if rings[chosen.ring].isEmpty {
                lanes[chosen.lane].mask &= ~(1 << UInt32(chosen.ring - chosen.lane * 25))
                emptied = emptied || (lanes[chosen.lane].mask == 0 && lanes[chosen.lane].host != 0)
            }
        }
    }

    /// Whether a queue may start something (it has ready operations and a
    /// free slot, and is not suspended). Reads fields in place: copying the
    /// whole `Queue` value would retain its arrays.
    @inline(__always)
    private func isEligible(_ q: QueueID) -> Bool {
        return !queues[q].suspended && queues[q].readyCount > 0
            && queues[q].counters.running < queues[q].maxConcurrent
    }

    /// Starts whatever may start now.
    private mutating func schedule(now: UInt64, into actions: inout [Action]) {
        rateWake = nil
        while true {
            var best: Candidate? = nil
            // By index: `for q in activeQueues` kept a reference to the
            // array for the loop (bestCandidate mutates self).
            var i = 0
            while i < activeQueues.count {
                let q = activeQueues[i]
                i += 1
                guard isEligible(q) else { continue }
                if let candidate = bestCandidate(in: q, now: now),
                   best == nil || candidate.beatsAcrossQueues(best!) {
                    best = candidate
                }
            }
            guard let chosen = best else { return }
            rings[chosen.ring].removeFirst()
            if rings[chosen.ring].isEmpty {
                lanes[chosen.lane].mask &= ~(1 << UInt32(chosen.ring - chosen.lane * 25))
                if lanes[chosen.lane].mask == 0 && lanes[chosen.lane].host != 0 { releaseEmptyLanes(of: chosen.queue) }
            }
            let s = chosen.slot
            slots[s].state = .running
            var payloads: [Dependency] = []
            if slots[s].links >= 0 { swap(&payloads, &linkTable[Int(slots[s].links)].dependencyPayloads) }
            let q = chosen.queue
            countReady(q, -1)
            countQueued(q, -1, isInternal: slots[s].isInternal)
            queues[q].counters.running += 1
            counters.running += 1
            if slots[s].isInternal { noteInternalRunning(q, 1) }
            let host = Int(slots[s].host)
            if host != 0 {
                hosts[host].running += 1
                if hosts[host].bucket != nil { hosts[host].bucket!.tokens -= 1 }
            }
            actions.append(.start(slots[s].id, dependencies: payloads, owner: slots[s].owner, network: slots[s].isNetwork))
        }
    }

    // MARK: - Time limits

    /// Whether `id`'s start deadline still applies: it waits to start, and
    /// has not started before (a retry's wait does not count).
    private func waitsToStart(_ id: OpID) -> Bool {
        guard let state = state(of: id), state == .waiting || state == .ready else { return false }
        return restarted.isEmpty || !restarted.contains(id)
    }

    private mutating func addStartDeadline(_ id: OpID, _ deadline: UInt64) {
        deadlines.insert(id, key: deadline)
        if deadlines.count >= deadlinesCompactAt {
            var kept = deadlines  // (the closure reads the machine)
            deadlines = MinHeap()
            kept.removeAll { !waitsToStart($0) }
            deadlines = kept
            deadlinesCompactAt = max(1024, 2 * deadlines.count)
        }
    }

    var startDeadlineEntries: Int { deadlines.count }

    /// The earliest time something is due (a start deadline, a retry, a
    /// rate-limit token), for the runtime's timer.
    mutating func nextDeadline() -> UInt64? {
        var next = rateWake
        while let top = deadlines.min {
            if waitsToStart(top.value) {
                next = min(next ?? top.key, top.key)
                break
            }
            deadlines.removeMin()
        }
        while let top = retries.min {
            if state(of: top.value) == .backoff {
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
        guard let s = liveSlot(id), slots[s].state == .running else { return [] }
        slots[s].state = .backoff
        let q = slots[s].queue
        queues[q].counters.running -= 1
        counters.running -= 1
        if slots[s].isInternal { noteInternalRunning(q, -1) }
        countQueued(q, 1, isInternal: slots[s].isInternal)
        if slots[s].host != 0 { hosts[Int(slots[s].host)].running -= 1 }
        retries.insert(id, key: until)
        restarted.insert(id)
        var actions: [Action] = []
        schedule(now: now, into: &actions)
        return actions
    }

    /// A running operation hands its slot and its work to a new internal
    /// operation, which is running from now on in the same queue and on the
    /// same host (it does not wait for a slot: it takes this one), and ends
    /// cancelled itself (by its own cancel). For a shared transfer whose
    /// leading caller was cancelled while other callers still wait for it.
    /// Returns the new operation's id; nil when `id` is not running.
    /// `newID`: as `Spec.id`.
    mutating func handOver(_ id: OpID, newID: OpID? = nil, now: UInt64, into actions: inout [Action]) -> OpID? {
        guard let s = liveSlot(id), slots[s].state == .running else { return nil }
        let q = slots[s].queue
        let newID = newID ?? nextOpID
        nextOpID = max(nextOpID, newID + 1)
        nextSeq += 1
        let n = allocate(Op(id: newID, queue: q, seq: nextSeq, host: slots[s].host, level: slots[s].level,
                            qos: slots[s].qos, isBarrier: false, isInternal: true, isNetwork: slots[s].isNetwork))
        slots[n].firstLevel = slots[n].level
        index.insert(newID, Int32(n))
        liveCount += 1
        listAppend(n, queue: q)
        slots[n].state = .running  // the queue's and host's running counts stay as they are
        noteInternalRunning(q, 1)
        retire(s, .cancelled, nil, byCancel: true, now: now, into: &actions)
        schedule(now: now, into: &actions)
        return newID
    }

    /// Fails the operations whose start deadline has passed.
    mutating func expire(now: UInt64, waitedMessage: (OpID) -> String) -> [Action] {
        var actions: [Action] = []
        while let top = deadlines.min, top.key <= now {
            deadlines.removeMin()
            if waitsToStart(top.value), let s = liveSlot(top.value) {
                end(s, .failed, .queueTimeout, .text(waitedMessage(top.value)), now: now, into: &actions)
            }
        }
        while let top = retries.min, top.key <= now {
            retries.removeMin()
            if let s = liveSlot(top.value), slots[s].state == .backoff { makeReady(s, now: now) }
        }
        schedule(now: now, into: &actions)
        return actions
    }

    // MARK: - Queries

    func isLive(_ id: OpID) -> Bool { liveSlot(id) != nil }
    /// The runtime's object of a live operation.
    func owner(of id: OpID) -> Owner? { liveSlot(id).flatMap { slots[$0].owner?.takeUnretainedValue() } }
    /// Sets (or with nil, drops) a live operation's object.
    mutating func setOwner(_ owner: Owner?, of id: OpID) {
        if let s = liveSlot(id) { setOwnerRef(s, owner) }
    }
    func state(of id: OpID) -> OpState? { liveSlot(id).map { slots[$0].state } }
    func group(of id: OpID) -> String? {
        liveSlot(id).flatMap { slots[$0].links < 0 ? nil : linkTable[Int(slots[$0].links)].group }
    }
    func finishedOutcome(of id: OpID) -> Outcome? { finishedSlot(id).map { slots[$0].outcome } }
    /// The runtime numbered `id`'s completion (it ended and its callback is
    /// on its way; `fq_wait`). Nothing for an id no longer remembered.
    mutating func noteCompletion(_ id: OpID, _ seq: UInt64) {
        if let s = index[id] { slots[Int(s)].completionSeq = seq }
    }

    /// `noteCompletion` for the slot the caller had (unless history let it go).
    mutating func noteCompletion(slot s: Int, id: OpID, _ seq: UInt64) {
        if slots[s].id == id { slots[s].completionSeq = seq }
    }

    /// The number `noteCompletion` gave an ended operation still remembered.
    func completionSeq(of id: OpID) -> UInt64? {
        guard let s = index[id], slots[Int(s)].state == .finished, slots[Int(s)].completionSeq > 0 else { return nil }
        return slots[Int(s)].completionSeq
    }

    /// What `fq_state` reports for `id`: nil for an id never booked, one
    /// history no longer remembers, and the engine's own (internal) work.
    /// Operations sharing a transfer, and those between two attempts, are
    /// `ready`, as the stats count them queued.
    func reportedState(of id: OpID) -> OperationState? {
        guard let s = index[id].map({ Int($0) }), !slots[s].isInternal else { return nil }
        switch slots[s].state {
        case .waiting: return .waiting
        case .ready, .backoff, .attached: return .ready
        case .running: return .running
        case .finished:
            switch slots[s].outcome {
            case .succeeded: return .succeeded
            case .failed: return .failed
            case .cancelled: return .cancelled
            }
        }
    }
}
