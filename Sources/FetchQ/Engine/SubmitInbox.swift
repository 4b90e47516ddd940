import Glibc

/// Submits waiting to be booked by the scheduler, so that a submit does not
/// wait for the engine lock while another thread holds it (the P1
/// benchmark's profile: half of all context switches were the submitting
/// thread sleeping on that lock).
///
/// The protocol, with `held` guarded by this inbox's own small lock:
/// - The engine lock's holder sets `held` when it takes the lock and takes
///   what waits here (`claim`). Before it lets the lock go it takes what
///   came meanwhile and books it, again while more comes (`release`), and
///   clears `held` when it finds nothing, in the same step.
/// - A submit appends here. If `held` was set, the holder (or the one it
///   handed over to, below) will take its entry: the submit returns at
///   once. If not, the submit takes the engine lock itself, which books its
///   entry.
/// - A holder books a bounded number of entries on its way out. If more
///   keep coming (submits faster than booking), it lets the lock go with
///   `held` still set and hands the rest to a worker job that takes the
///   lock and goes on the same way (`release` says `.handOver`). So a
///   cancel, a wait or an operation's end never books for others for long,
///   and a submit never waits for the lock while someone is booking.
/// - The inbox is not bounded: a thread that submits faster than the
///   engine books runs ahead of it, as far as it likes (the operations exist
///   either way; booked, they would wait in the queue). A bound that made
///   such a submit wait, or book for itself, was measured: with priorities
///   the submitting thread then fought the workers for the engine lock and
///   P1 fell to a third (bench/findings.md, Ninth round).
///
/// So every entry is booked, in the order the entries came, by a thread
/// holding the engine lock; whoever takes that lock to look at the
/// scheduler (a cancel, a wait, the stats) takes what waits first, so it
/// sees every operation whose submit returned before.
///
/// `@unchecked Sendable`: everything is guarded by `lock`.
final class SubmitInbox: @unchecked Sendable {
    /// A block or async operation (with no barrier; with dependencies only
    /// through the gate). `op` holds one reference, taken by hand
    /// at `init`, which booking hands on to the operation's scheduler slot:
    /// the thread that books (under the engine lock) neither counts nor
    /// reads the object, which the submitting thread made on another core.
    /// Its fields are copied here for the same reason.
    struct Entry {
        let op: Unmanaged<Operation>
        let id: OpID
        let queue: QueueID
        let qos: QoS
        let submittedAt: UInt64
        let priority: Priority
        let group: String?
        let startDeadline: UInt64?
        /// "depends_on", when the submit passed the dependency gate
        /// (`DependencyGate.enter`), counted in phase `gatePhase` (-1: none)
        /// until it is booked.
        let dependsOn: [OpID]
        let gatePhase: Int8

        init(op: Operation, priority: Priority, group: String?, startDeadline: UInt64?, dependsOn: [OpID] = [],
             gatePhase: Int = -1) {
            self.op = .passRetained(op)
            self.dependsOn = dependsOn
            self.gatePhase = Int8(gatePhase)
            id = op.id
            queue = op.queue
            qos = op.qos
            submittedAt = op.submittedAt
            self.priority = priority
            self.group = group
            self.startDeadline = startDeadline
        }
    }

    enum Push {
        /// The engine lock's holder books it.
        case queued
        /// Nobody holds the engine lock: the caller must take it.
        case mustLock
        /// Not accepted (the engine is being freed, or the queue closed).
        case refused(FetchQError)
    }

    private let lock = ConditionLock()
    private var entries: [Entry] = []
    private var held = false
    /// Set once the engine begins shutting down: submits fail from then on.
    private var shuttingDown = false
    /// By QueueID: the queue was closed (fq_queue_free); its submits fail.
    private var closed: [Bool] = []

    deinit {
        for entry in entries { entry.op.release() }  // never booked (the engine books all it accepted)
    }

    /// Takes the entry (and its reference): kept until booked, or let go
    /// at once when refused.
    func push(_ entry: consuming Entry) -> Push {
        lock.lock()
        let refusal: FetchQError
        if shuttingDown {
            refusal = FetchQError(.shutdown, "the engine is being freed")
        } else if entry.queue < closed.count && closed[entry.queue] {
            refusal = FetchQError(.invalid, "the queue has been freed")
        } else {
            entries.append(entry)
            let push: Push = held ? .queued : .mustLock
            lock.unlock()
            return push
        }
        lock.unlock()
        entry.op.release()
        return .refused(refusal)
    }

    /// The engine lock was just taken: what waits, if anything.
    func claim() -> [Entry]? {
        lock.lock()
        defer { lock.unlock() }
        held = true
        return takeEntries()
    }

    enum Release {
        /// Book these, then call `release` again.
        case book([Entry])
        /// Nothing waits: `held` is cleared, the lock may go.
        case done
        /// Entries wait but the caller booked its share (`stop`): the lock
        /// may go, `held` stays set, and the caller must start a job that
        /// takes the lock to book them.
        case handOver
    }

    /// The engine lock is about to be let go (see the protocol above).
    func release(stop: Bool) -> Release {
        lock.lock()
        defer { lock.unlock() }
        if entries.isEmpty {
            held = false
            return .done
        }
        if stop { return .handOver }
        return .book(takeEntries()!)
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
        lock.lock()
        shuttingDown = true
        lock.unlock()
    }

    /// Submits to `queue` are taken (a new queue, or one given a forgotten
    /// queue's id).
    func openQueue(_ queue: QueueID) {
        lock.lock()
        if queue < closed.count { closed[queue] = false }
        lock.unlock()
    }

    /// Submits to `queue` fail from now on.
    func closeQueue(_ queue: QueueID) {
        lock.lock()
        if queue >= closed.count { closed += [Bool](repeating: false, count: queue + 1 - closed.count) }
        closed[queue] = true
        lock.unlock()
    }
}
