import Glibc

/// A thread that calls `fire` when the next deadline passes. `fire` does the
/// work due and returns the next deadline (monotonic ns), or nil for none.
/// `kick()` makes it ask again (a new, possibly earlier, deadline).
///
/// `@unchecked Sendable`: `kicked`, `stopping` guarded by `lock`; `thread`
/// set in init, read in stop().
final class DeadlineTimer: @unchecked Sendable {
    private let lock = ConditionLock()
    private var kicked = false
    private var stopping = false
    private var thread: pthread_t?

    init(fire: @escaping @Sendable () -> UInt64?) throws(FetchQError) {
        thread = try startThread(name: "fetchq-timer") { [self] in
            var next: UInt64? = nil
            while true {
                lock.lock()
                while !kicked && !stopping {
                    if let n = next, monotonicNanos() >= n { break }
                    lock.wait(until: next)
                }
                kicked = false
                let stop = stopping
                lock.unlock()
                if stop { return }
                next = fire()
            }
        }
    }

    func kick() {
        lock.withLock { kicked = true }
        lock.signal()
    }

    func stop() {
        lock.withLock { stopping = true }
        lock.signal()
        if let thread { joinThread(thread) }
        thread = nil
    }
}
