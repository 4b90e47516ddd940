import Glibc

/// The closure a thread runs, boxed to cross pthread_create's void pointer.
private final class ThreadBody {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}

/// Starts a joinable pthread running `body`; nil when the system refuses a
/// thread (its limit on threads or processes, or memory for the stack):
/// the callers go on without what the thread would have done.
func startThread(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
    let box = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var tid = pthread_t()
    let rc = pthread_create(&tid, nil, { raw in
        Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue().run()
        return nil
    }, box)
    guard rc == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
        return nil
    }
    return tid
}

/// Seconds since an arbitrary fixed point (CLOCK_MONOTONIC).
func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Writes all of `bytes` to `fd`, retrying after EINTR and short writes.
/// A reader that went away (`fetchq ... | head`) ends the process by
/// SIGPIPE, as for any Unix filter; if SIGPIPE happens to be ignored at that
/// moment (libcurl ignores it around its own calls), EPIPE on stdout ends it
/// the same way, with status 141. Returns the errno of any other failure
/// (a full disk, a closed descriptor), nil when everything was written.
@discardableResult
func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Int32? {
    bytes.withUnsafeBytes { raw in
        var offset = 0
        while offset < raw.count {
            let n = write(fd, raw.baseAddress! + offset, raw.count - offset)
            if n > 0 {
                offset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                // A descriptor the parent made non-blocking (a full pipe):
                // wait until it takes more, as a blocking one would (it was
                // a write error, and a cut line: the tenth review).
                var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&ready, 1, -1)
                continue
            } else if n < 0 && errno == EPIPE && fd == 1 {
                _exit(128 + SIGPIPE)
            } else {
                return n < 0 ? errno : EIO  // 0 bytes written: no progress possible
            }
        }
        return nil
    }
}

/// pipe(2) with both ends close-on-exec; nil on failure.
func makePipe() -> (read: Int32, write: Int32)? {
    var fds: [Int32] = [-1, -1]
    guard pipe(&fds) == 0 else { return nil }
    for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    return (fds[0], fds[1])
}
