import Glibc

/// A value behind a pthread mutex, with `Synchronization.Mutex`'s `withLock`
/// shape. Used instead of `Mutex` because ThreadSanitizer cannot see `Mutex`'s
/// contended slow path (it lives in the uninstrumented
/// libswiftSynchronization.so) and reports false races; pthread mutexes are
/// intercepted by the sanitizers, so races are reported only when real.
///
/// `@unchecked Sendable`: `value` is only touched inside `withLock`, with
/// `mutex` held.
final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    func withLock<R, E: Error>(_ body: (inout Value) throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
