import CFetchQSupport
import Glibc
import Synchronization

/// A fixed pool of threads running jobs; higher QoS first, FIFO within a
/// QoS. Used for block/async bodies and parsing large responses (never for
/// network I/O).
///
/// `@unchecked Sendable`: `jobs` and `stopping` are guarded by `lock`;
/// `threads` is written only in `start` and read in `stop()`.
final class WorkerPool: @unchecked Sendable {
    /// An operation's body (no closure allocated per operation), or other
    /// work such as parsing a response.
    enum Job {
        /// The operation with one reference taken by hand for the worker
        /// that runs it (`Job.run`): queuing and taking the job then copy
        /// no reference, and the worker keeps this one while it runs.
        case body(Unmanaged<Operation>)
        case closure(@Sendable () -> Void)

        static func run(_ op: Operation) -> Job { .body(.passRetained(op)) }
    }

    private let lock = ConditionLock()
    private var jobs = [Ring<Job>](repeating: Ring(), count: QoS.allCases.count)
    private var pending = 0 {
        didSet { pendingHint.store(pending, ordering: .relaxed) }
    }
    /// `pending`, readable without the lock: a hint, exact only under it.
    private let pendingHint = Atomic<Int>(0)
    private var stopping = false
    private var threads: [pthread_t] = []
    /// Each thread's values to free (see ReleaseList); they outlive the threads.
    private let releaseLists: [ReleaseList]

    /// No thread runs until `start`.
    init(count: Int) {
        releaseLists = (0..<count).map { _ in ReleaseList() }
    }

    deinit {
        // Jobs never run (none are left after `stop`): their operations'
        // references are held by hand.
        for q in jobs.indices {
            while !jobs[q].isEmpty {
                if case .body(let op) = jobs[q].removeFirst() { op.release() }
            }
        }
    }

    /// Starts the threads; `owner` is recorded as their current engine (see
    /// fq_support.h). Called once. When one cannot be started, those that
    /// were are stopped, and the error is thrown.
    func start(owner: UnsafeRawPointer) throws(FetchQError) {
        let ownerBits = UInt(bitPattern: owner)
        for index in releaseLists.indices {
            do {
                threads.append(try startThread(name: "fetchq-work-\(index)") { [self] in
                    fqs_set_current_engine(UnsafeRawPointer(bitPattern: ownerBits))
                    releaseLists[index].makeCurrent()
                    run(releaseLists[index])
                })
            } catch {
                stop()
                throw error
            }
        }
    }

    /// Queues a job. `wake: false` is for a worker queuing work at the end
    /// of its own job: it will take that job itself, so another worker is
    /// woken only if more than that one job is waiting.
    func submit(qos: QoS, wake: Bool = true, _ job: @escaping @Sendable () -> Void) {
        submit(qos: qos, wake: wake, job: .closure(job))
    }

    func submit(qos: QoS, wake: Bool = true, job: consuming Job) {
        lock.lock()  // not withLock: a closure would borrow `job`, which is moved in here
        jobs[qos.rawValue].append(job)
        pending += 1
        let signal = wake || pending > 1
        lock.unlock()
        if signal { lock.signal() }
    }

    private func run(_ releases: ReleaseList) {
        while true {
            releases.drain()
            lock.lock()
            if pending == 0 && !stopping && releases.isOpen {
                // About to sleep: free what was handed back, take no more.
                lock.unlock()
                releases.close()
                lock.lock()
            }
            while pending == 0 && !stopping { lock.wait(until: nil) }
            if pending == 0 {  // stopping and drained
                lock.unlock()
                releases.close()
                return
            }
            let job = takeJob()
            pending -= 1
            lock.unlock()
            releases.open()
            // Consumed: the job's reference is the one the body runs with.
            switch consume job {
            case .body(let op):
                // The engine is reached without a reference of its own: every
                // engine thread counting the engine object made one contended
                // cache line (its operations cannot outlive it).
                op._withUnsafeGuaranteedRef { Unmanaged.passUnretained($0.engine) }
                    ._withUnsafeGuaranteedRef { $0.runBody(op) }
            case .closure(let body): body()
            }
        }
    }

    /// With the lock held and a job pending: the first job of the highest QoS.
    private func takeJob() -> Job {
        var qos = jobs.count - 1
        while jobs[qos].isEmpty { qos -= 1 }
        return jobs[qos].removeFirst()
    }

    /// No job is waiting (a hint: another thread may queue one right after).
    var isIdle: Bool { pendingHint.load(ordering: .relaxed) == 0 }

    /// Runs what is queued, then stops and joins the threads.
    func stop() {
        lock.withLock { stopping = true }
        lock.broadcast()
        for t in threads { joinThread(t) }
        threads = []
    }
}
