import CFuzzerDriver
import Glibc

#if FUZZING
/// clang's `-fsanitize=fuzzer` link step adds libFuzzer's own `main` object, which
/// references this symbol; SwiftPM's `--defsym main=<module>_main` makes our `main`
/// win, so this is only there to satisfy the linker (and forwards, should it be used).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    FuzzMain.target!(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
#endif

/// The `main` of every fuzz executable.
///
/// Built with `-DFUZZING` (and `-sanitize=fuzzer`), it hands the command line to
/// libFuzzer, which calls the target once per generated input. Built without it, it
/// replays inputs: every argument is a file or a directory of files (not recursive,
/// dot-files skipped), each run once through the same target; a failed oracle or a
/// crash stops the process with the path of the input printed.
public enum FuzzMain {
    /// The target being run (libFuzzer's callback cannot capture context).
    nonisolated(unsafe) static var target: ((UnsafeRawBufferPointer) -> Void)?

    public static func run(name: String, _ body: @escaping (UnsafeRawBufferPointer) -> Void) -> Never {
        target = body
        #if FUZZING
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        let status = LLVMFuzzerRunDriver(&argc, &argv) { data, size in
            FuzzMain.target!(UnsafeRawBufferPointer(start: data, count: size))
            return 0
        }
        exit(status)
        #else
        exit(replay(name: name, Array(CommandLine.arguments.dropFirst())))
        #endif
    }

    // MARK: - Replay

    static func replay(name: String, _ arguments: [String]) -> Int32 {
        if arguments.isEmpty || arguments.contains("-h") || arguments.contains("--help") {
            print("usage: fuzz-\(name) FILE|DIR...   (replay build: runs each input once)")
            print("(a fuzzing build takes libFuzzer's arguments: see docs/reliability.md)")
            return arguments.isEmpty ? 2 : 0
        }
        var files: [String] = []
        for argument in arguments {
            guard let found = inputs(at: argument) else {
                print("fuzz-\(name): cannot read \(argument)")
                return 2
            }
            files += found
        }
        installCrashReporter()
        for file in files {
            guard let bytes = readFile(file) else {
                print("fuzz-\(name): cannot read \(file)")
                return 2
            }
            setCurrentInput(file)
            bytes.withUnsafeBytes { target!($0) }
        }
        setCurrentInput(nil)
        print("fuzz-\(name): \(files.count) inputs replayed, no failures")
        return 0
    }

    /// The file itself, or the regular files of a directory sorted by name.
    static func inputs(at path: String) -> [String]? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        if (info.st_mode & S_IFMT) != S_IFDIR { return [path] }
        guard let dir = opendir(path) else { return nil }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name.hasPrefix(".") || name == "README.md" { continue }
            var sub = stat()
            let full = path.hasSuffix("/") ? path + name : path + "/" + name
            if stat(full, &sub) == 0, (sub.st_mode & S_IFMT) == S_IFREG { names.append(full) }
        }
        return names.sorted()
    }

    static func readFile(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 { return nil }
            if n == 0 { return result }
            result += chunk[0..<n]
        }
    }

    // MARK: - Naming the input that crashed

    /// The path being replayed, NUL-terminated, for the signal handler.
    nonisolated(unsafe) static var currentInput = [CChar](repeating: 0, count: 4096)

    static func setCurrentInput(_ path: String?) {
        let bytes = Array((path ?? "").utf8.prefix(4000))
        for (i, b) in bytes.enumerated() { currentInput[i] = CChar(bitPattern: b) }
        currentInput[bytes.count] = 0
    }

    static func reportCurrentInput() {
        currentInput.withUnsafeBufferPointer { buffer in
            let prefix = "\nfuzz replay: failed while running the input "
            _ = write(2, prefix, prefix.utf8.count)
            _ = write(2, buffer.baseAddress, strlen(buffer.baseAddress!))
            _ = write(2, "\n", 1)
        }
    }

    /// Swift traps (SIGILL/SIGTRAP) and aborts go through a signal handler; sanitizer
    /// reports (which own SIGSEGV/SIGBUS when present) through their death callback.
    static func installCrashReporter() {
        let sanitizer = fq_fuzz_set_sanitizer_death_callback { FuzzMain.reportCurrentInput() }
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { signal in
            FuzzMain.reportCurrentInput()
            Glibc.signal(signal, SIG_DFL)
            raise(signal)
        }
        var signals = [SIGILL, SIGTRAP, SIGABRT, SIGFPE]
        if !sanitizer { signals += [SIGSEGV, SIGBUS] }
        for s in signals { sigaction(s, &action, nil) }
    }
}
