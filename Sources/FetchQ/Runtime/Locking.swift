import CFetchQSupport
import Glibc

/// A pthread mutex with a condition variable that waits on the monotonic
/// clock. Heap-allocated so the pthread objects never move.
///
/// `@unchecked Sendable`: the pthread objects are themselves the
/// synchronisation; the class holds no other state.
final class ConditionLock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let cond: UnsafeMutablePointer<pthread_cond_t>

    init() {
        mutex = .allocate(capacity: 1)
        cond = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        cond.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    /// Takes the lock if nobody holds it.
    func tryLock() -> Bool { pthread_mutex_trylock(mutex) == 0 }

    @inline(__always)
    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    func signal() { pthread_cond_signal(cond) }
    func broadcast() { pthread_cond_broadcast(cond) }

    /// Waits with the lock held. Returns false when `deadline` (monotonic
    /// nanoseconds) passed; nil waits without a deadline.
    @discardableResult
    func wait(until deadline: UInt64?) -> Bool {
        guard let deadline else {
            pthread_cond_wait(cond, mutex)
            return true
        }
        var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        return pthread_cond_timedwait(cond, mutex, &ts) != ETIMEDOUT
    }
}

/// Monotonic time in nanoseconds.
@inline(__always)
func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

/// A deadline `timeoutMs` from now; nil for a negative timeout (wait forever).
func deadline(afterMs timeoutMs: Int) -> UInt64? {
    timeoutMs < 0 ? nil : monotonicNanos() &+ UInt64(timeoutMs) &* 1_000_000
}

/// Starts a detached-from-Swift pthread running `body`; returns its handle
/// for joining. Throws `.noMemory` when the system refuses a thread (its
/// limit on threads or processes, or on memory for the stack).
func startThread(name: String, _ body: @escaping @Sendable () -> Void) throws(FetchQError) -> pthread_t {
    final class Box: @unchecked Sendable {  // handed to exactly one thread
        let body: @Sendable () -> Void
        let name: String
        init(_ body: @escaping @Sendable () -> Void, _ name: String) { self.body = body; self.name = name }
    }
    let box = Unmanaged.passRetained(Box(body, name)).toOpaque()
    var tid = pthread_t()
    let rc = fqs_start_thread(&tid, { raw in
        let box = Unmanaged<AnyObject>.fromOpaque(raw!).takeRetainedValue() as! Box
        fqs_set_thread_name(box.name)
        fqs_jansson_cache_thread_enable(1)  // an engine thread keeps freed jansson blocks
        box.body()
        return nil
    }, box)
    guard rc == 0 else {
        Unmanaged<AnyObject>.fromOpaque(box).release()
        throw FetchQError(.noMemory, "cannot start the engine's thread \(name): pthread_create failed: "
                          + String(cString: strerror(rc)) + " (each engine thread reserves an 8 MiB stack)")
    }
    return tid
}

func joinThread(_ tid: pthread_t) {
    pthread_join(tid, nil)
}
