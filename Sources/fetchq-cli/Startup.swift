import Glibc

/// What the process found at its start (see `Startup.prepare`). Written once,
/// before any thread starts; only read afterwards.
enum Startup {
    nonisolated(unsafe) private(set) static var stdoutWasClosed = false
    nonisolated(unsafe) private(set) static var stdinWasClosed = false

    /// Before anything else runs: a standard input, output or error that was closed
    /// gets /dev/null in its place, so that no descriptor the engine opens
    /// (an eventfd, a socket) becomes "standard output" and receives the
    /// results; results for a closed standard output are then a write error
    /// (EBADF), reported like any other. Arguments that are not UTF-8 are a
    /// usage error: Swift would replace those bytes with U+FFFD, and the
    /// query, URL, header or body sent would not be the one given.
    static func prepare() {
        for fd: Int32 in [0, 1, 2] where fcntl(fd, F_GETFD) == -1 && errno == EBADF {
            // (Standard input too: closed, the first file `--input FILE`
            // opened became descriptor 0, which a later `--input -` then
            // read, at its end: nothing, and no error. The tenth review.)
            let null = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY)
            if null >= 0 && null != fd {
                dup2(null, fd)
                close(null)
            }
            if fd == 0 { stdinWasClosed = true }
            if fd == 1 { stdoutWasClosed = true }
        }
        for i in 1..<Int(CommandLine.argc) {
            guard let argument = CommandLine.unsafeArgv[i], String(validatingCString: argument) == nil else { continue }
            writeAll(2, Array("fetchq: argument \(i) is not valid UTF-8 text; the CLI sends text as UTF-8 and will not alter it\n".utf8))
            exit(2)
        }
    }
}
