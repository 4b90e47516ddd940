import Synchronization

/// Operations submitted whose callback has not returned yet, per queue and
/// in all: what `fq_queue_wait` and `fq_engine_wait` wait for.
///
/// It has its own lock, taken after the engine's (a submit counts its
/// operation while it holds the engine lock) and never before it: the
/// thread that ran a batch of callbacks books them here without taking the
/// engine lock, which the P1 benchmark's profile showed as the delivery
/// thread's most frequent reason to sleep.
///
/// `@unchecked Sendable`: `counts` and `total` are guarded by `lock`.
final class Outstanding: @unchecked Sendable {
    private let lock = ConditionLock()
    private var counts = QueueCounts()
    private var total = 0
    /// The `completionSeq` of the last completion whose callback returned
    /// (they return in that order: see `Delivery`).
    private var deliveredSeq: UInt64 = 0
    /// Threads in `waitForDelivered`: each batch wakes them.
    private var seqWaiters = 0
    /// The `completionSeq` of the last completion whose callback returned,
    /// set as each one returns (`returned`), while `deliveredSeq` moves once
    /// per batch: a wait for one operation (`fq_wait`) must not wait for the
    /// callbacks after its own in the same batch.
    private let returnedSeq = Atomic<UInt64>(0)
    /// `seqWaiters`, readable without the lock by `returned`.
    private let seqWaiting = Atomic<Int>(0)

    /// `n` more operations of `queue` await their callbacks.
    func add(_ queue: QueueID, _ n: Int = 1) {
        lock.lock()
        counts[queue] += n
        total += n
        lock.unlock()
    }

    /// The callbacks of these operations (one entry each) returned, the
    /// last of them numbered `lastCompletion`.
    func done(_ queues: [QueueID], lastCompletion: UInt64) {
        lock.lock()
        deliveredSeq = max(deliveredSeq, lastCompletion)
        var wake = seqWaiters > 0
        for queue in queues {
            counts[queue] -= 1
            if counts[queue] == 0 { wake = true }
        }
        total -= queues.count
        if total == 0 { wake = true }
        lock.unlock()
        if wake { lock.broadcast() }
    }

    /// The callback of the completion numbered `seq` returned (called for
    /// each one, in order, before its batch is booked with `done`). Wakes the
    /// threads in `waitForDelivered`, if any: an atomic store and load
    /// otherwise. (Sequentially consistent: either such a thread sees `seq`
    /// when it checks, or this sees the thread and wakes it.)
    func returned(_ seq: UInt64) {
        returnedSeq.store(seq, ordering: .sequentiallyConsistent)
        if seqWaiting.load(ordering: .sequentiallyConsistent) > 0 {
            lock.lock()
            lock.unlock()
            lock.broadcast()
        }
    }

    /// The last completion called back, with the lock held.
    private var lastReturned: UInt64 {
        max(deliveredSeq, returnedSeq.load(ordering: .sequentiallyConsistent))
    }

    /// The `completionSeq` of the last completion called back.
    var delivered: UInt64 { lock.withLock { lastReturned } }

    /// Waits until the completion numbered `seq` was called back (`atLeast`
    /// true), or any after `seq` (`atLeast` false); false when `until`
    /// (monotonic nanoseconds; nil: no limit) passed first.
    func waitForDelivered(_ seq: UInt64, atLeast: Bool, until: UInt64?) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        seqWaiters += 1
        seqWaiting.add(1, ordering: .sequentiallyConsistent)
        defer {
            seqWaiters -= 1
            seqWaiting.subtract(1, ordering: .sequentiallyConsistent)
        }
        while atLeast ? lastReturned < seq : lastReturned <= seq {
            if !lock.wait(until: until) && (atLeast ? lastReturned < seq : lastReturned <= seq) { return false }
        }
        return true
    }

    /// How many of `queue`'s (nil: of all queues) await their callbacks.
    func count(_ queue: QueueID?) -> Int {
        lock.withLock { pending(queue) }
    }

    /// `count` with the lock held.
    private func pending(_ queue: QueueID?) -> Int { queue.map { counts[$0] } ?? total }

    /// Waits until `count(queue)` is 0; false when `until` (monotonic
    /// nanoseconds; nil: no limit) passed first.
    func waitForZero(_ queue: QueueID?, until: UInt64?) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        while pending(queue) > 0 {
            if !lock.wait(until: until) && pending(queue) > 0 { return false }
        }
        return true
    }
}
