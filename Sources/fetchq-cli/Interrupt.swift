import Glibc

/// The write end of the self-pipe the SIGINT handler writes to. Set once,
/// before the handler is installed, and never changed: the handler only
/// reads it, so `nonisolated(unsafe)` is safe.
nonisolated(unsafe) private var interruptPipeWrite: Int32 = -1

/// Ctrl-C handling: the signal handler only writes one byte to a pipe
/// (async-signal-safe); a watcher thread blocked on the pipe does the real
/// work (cancelling the engine's operations) outside signal context. After
/// the first Ctrl-C the default action is restored, so a second one ends
/// the process at once.
enum Interrupt {
    static func install(_ onInterrupt: @escaping @Sendable () -> Void) {
        // Started with SIGINT ignored (a background job of a shell, `trap ''
        // INT`): Ctrl-C is not meant for this process; leave it ignored.
        var current = sigaction()
        if sigaction(SIGINT, nil, &current) == 0,
           unsafeBitCast(current.__sigaction_handler.sa_handler, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self) {
            return
        }
        guard let fds = makePipe() else { return }
        let readEnd = fds.read
        // Without a watcher thread (the system refused one) Ctrl-C keeps
        // its default action: it ends the process at once, status 130.
        let watcher = startThread {
            var byte: UInt8 = 0
            while true {
                let n = read(readEnd, &byte, 1)
                if n == 1 { break }
                if n < 0 && errno == EINTR { continue }
                return
            }
            signal(SIGINT, SIG_DFL)
            onInterrupt()
        }
        guard watcher != nil else {
            close(fds.read)
            close(fds.write)
            return
        }
        interruptPipeWrite = fds.write
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            let saved = errno
            var byte: UInt8 = 1
            _ = write(interruptPipeWrite, &byte, 1)
            errno = saved
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = SA_RESTART
        sigaction(SIGINT, &action, nil)
    }
}
