import Glibc

/// Submits waiting to be booked by the scheduler, so that a submit does not
/// wait for the engine lock while another thread holds it (the P1
/// benchmark's profile: half of all context switches were the submitting
/// thread sleeping on that lock).
///
/// The protocol, with `held` guarded by this inbox's own small lock:
/// - The engine lock's holder sets `held` when it takes the lock
///   (`claim`) and, before it lets the lock go, books whatever is waiting
///   here until it finds nothing, and only then clears `held` (`release`).
/// - A submit appends here. If `held` was set, the holder will find its
///   entry before it lets the lock go: the submit returns at once. If not,
///   the submit takes the engine lock itself, which books its entry.
///
/// So every entry is booked by the thread holding the engine lock, in the
/// order the entries came, before that lock is next free; and whoever
/// takes the engine lock to look at the scheduler (a cancel, a wait, the
/// stats) sees every operation whose submit returned before.
///
/// `@unchecked Sendable`: everything is guarded by `mutex`.
final class SubmitInbox: @unchecked Sendable {
    /// A block or async operation (its queue, QoS and id are in `op`).
    struct Entry {
        let op: Operation
        let priority: Priority
        let group: String?
        let startDeadline: UInt64?
    }

    enum Push {
        /// The engine lock's holder books it.
        case queued
        /// Nobody holds the engine lock: the caller must take it.
        case mustLock
        /// Not accepted (the engine is being freed, or the queue closed).
        case refused(FetchQError)
    }

    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var entries: [Entry] = []
    private var held = false
    /// Set once the engine begins shutting down: submits fail from then on.
    private var shuttingDown = false
    /// By QueueID: the queue was closed (fq_queue_free); its submits fail.
    private var closed: [Bool] = []

    init() {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    func push(_ entry: Entry) -> Push {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        if shuttingDown { return .refused(FetchQError(.shutdown, "the engine is being freed")) }
        let queue = entry.op.queue
        if queue < closed.count && closed[queue] {
            return .refused(FetchQError(.invalid, "the queue has been freed"))
        }
        entries.append(entry)
        return held ? .queued : .mustLock
    }

    /// The engine lock was just taken: what waits, if anything.
    func claim() -> [Entry]? {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        held = true
        return takeEntries()
    }

    /// The engine lock is about to be let go: what waits (book it and call
    /// again), or nil, and then nobody books entries until the next `claim`.
    func release() -> [Entry]? {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        if let taken = takeEntries() { return taken }
        held = false
        return nil
    }

    private func takeEntries() -> [Entry]? {
        guard !entries.isEmpty else { return nil }
        var taken: [Entry] = []
        taken.reserveCapacity(entries.count)
        swap(&taken, &entries)
        return taken
    }

    /// Submits fail from now on (call before taking the engine lock to
    /// shut down: what is already here is booked, then cancelled).
    func refuseAll() {
        pthread_mutex_lock(mutex)
        shuttingDown = true
        pthread_mutex_unlock(mutex)
    }

    /// Submits to `queue` fail from now on.
    func closeQueue(_ queue: QueueID) {
        pthread_mutex_lock(mutex)
        if queue >= closed.count { closed += [Bool](repeating: false, count: queue + 1 - closed.count) }
        closed[queue] = true
        pthread_mutex_unlock(mutex)
    }
}
