import CJansson
import FetchQ
import Glibc
import Synchronization

/// The fault-injecting server (Tests/support/testserver.py) in a child process,
/// one per test so server-side counters belong to that test alone.
///
///     let server = try TestServer()
///     let url = server.url("/json?size=3")
///
/// Stopped (SIGTERM, then waitpid) by `stop()` or deinit; it also exits by
/// itself when this process dies (`--parent-pid`).
final class TestServer: Sendable {
    let pid: pid_t
    let port: Int
    /// With `tls: true`: the server's self-signed certificate (PEM, for 127.0.0.1),
    /// usable as `HTTPRequest.caFile`.
    let certificateFile: String?
    var baseURL: String { "\(certificateFile == nil ? "http" : "https")://127.0.0.1:\(port)" }

    private let workDir: String
    private let stopped = Mutex(false)
    /// For `get` (server stats); separate from the transport under test.
    private let client: CurlTransport

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// - Parameters:
    ///   - files: passed as `--files` (a directory the server may serve).
    ///   - tls: serve HTTPS with a fresh self-signed certificate (made with `openssl`).
    ///   - startupTimeout: how long to wait for the port.
    init(files: String? = nil, tls: Bool = false, startupTimeout: Double = 10, filePath: String = #filePath) throws {
        let root = try Self.repositoryRoot(from: filePath)
        let script = root + "/Tests/support/testserver.py"
        guard access(script, R_OK) == 0 else { throw Failure(description: "no test server at \(script)") }

        client = try CurlTransport()
        var template = Array("/tmp/fetchq-testserver-XXXXXX".utf8CString)
        guard let dir = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw Failure(description: "mkdtemp failed: errno \(errno)")
        }
        workDir = String(cString: dir)
        let portFile = workDir + "/port"
        let logFile = workDir + "/server.log"

        // -B: do not write __pycache__ into the repository.
        var arguments = [
            "python3", "-B", script, "--port", "0", "--port-file", portFile, "--parent-pid", String(getpid()),
        ]
        if let files { arguments += ["--files", files] }
        if tls {
            let cert = workDir + "/cert.pem"
            let key = workDir + "/key.pem"
            let openssl: pid_t
            do {
                openssl = try Self.spawn([
                    "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert,
                ], logFile: workDir + "/openssl.log")
            } catch {
                Self.removeWorkDir(workDir)
                throw error
            }
            guard Self.waitForExit(openssl, timeout: 20) == 0 else {
                Self.removeWorkDir(workDir)
                throw Failure(description: "openssl could not make a test certificate")
            }
            arguments += ["--tls-cert", cert, "--tls-key", key]
            certificateFile = cert
        } else {
            certificateFile = nil
        }
        do {
            pid = try Self.spawn(arguments, logFile: logFile)
        } catch {
            Self.removeWorkDir(workDir)
            throw error
        }

        // Wait (bounded) for the port; fail early if the server died.
        let deadline = TestClock.now() + startupTimeout
        var found: Int?
        while found == nil {
            if let text = Self.readFile(portFile), let value = Self.parsePort(text) {
                found = value
                break
            }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                stopped.withLock { $0 = true }
                let log = Self.readFile(logFile) ?? ""
                Self.removeWorkDir(workDir)
                throw Failure(description: "test server exited during startup (status \(status)):\n\(log.suffix(2000))")
            }
            if TestClock.now() > deadline {
                stopped.withLock { $0 = true }
                Self.terminate(pid)
                Self.removeWorkDir(workDir)
                throw Failure(description: "test server did not report a port within \(startupTimeout) s")
            }
            usleep(5_000)
        }
        port = found!
    }

    deinit { stop() }

    func url(_ path: String) -> String { baseURL + path }

    /// GET through a CurlTransport of the helper's own; bounded by `timeout` seconds.
    func get(_ path: String, timeout: Double = 10) throws -> (status: Int, body: [UInt8]) {
        let request = HTTPRequest(url: url(path), timeoutMs: Int(timeout * 1000), caFile: certificateFile)
        let box = TestCollector<Result<HTTPResponse, TransportError>>()
        _ = client.start(request, progress: nil) { box.add($0) }
        guard let result = box.waitFirst(timeout: timeout + 5) else {
            throw Failure(description: "GET \(path) did not complete")
        }
        let response = try result.get()
        return (response.status, response.body)
    }

    /// The server's /stats counters (integer fields only).
    func stats() throws -> [String: Int] {
        let (status, body) = try get("/stats")
        guard status == 200, let json = TestJSON(parsing: body) else {
            throw Failure(description: "/stats answered \(status)")
        }
        var out: [String: Int] = [:]
        for key in json.keys { if let n = json[key]?.int { out[key] = n } }
        return out
    }

    func resetStats() throws {
        let (status, _) = try get("/stats/reset")
        guard status == 200 else { throw Failure(description: "/stats/reset answered \(status)") }
    }

    /// Polls /stats until `predicate` holds; returns the last stats, or nil on timeout.
    func waitForStats(timeout: Double = 10, _ predicate: ([String: Int]) -> Bool) throws -> [String: Int]? {
        let deadline = TestClock.now() + timeout
        while true {
            let s = try stats()
            if predicate(s) { return s }
            if TestClock.now() > deadline { return nil }
            usleep(20_000)
        }
    }

    /// SIGTERM, then wait up to 5 s before SIGKILL. Idempotent.
    func stop() {
        let first = stopped.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        guard first else { return }
        client.shutdown()
        Self.terminate(pid)
        Self.removeWorkDir(workDir)
    }

    private static func terminate(_ pid: pid_t) {
        kill(pid, SIGTERM)
        _ = waitForExit(pid, timeout: 5)
    }

    // MARK: - Process plumbing

    private static func repositoryRoot(from filePath: String) throws -> String {
        var dir = filePath
        while let slash = dir.lastIndex(of: "/") {
            dir = String(dir[..<slash])
            if dir.isEmpty { break }
            if access(dir + "/Package.swift", F_OK) == 0 { return dir }
        }
        throw Failure(description: "no Package.swift above \(filePath)")
    }

    /// Waits for a child to exit; its exit status, or nil (killed) after `timeout` s.
    private static func waitForExit(_ pid: pid_t, timeout: Double) -> Int32? {
        let deadline = TestClock.now() + timeout
        var status: Int32 = 0
        while waitpid(pid, &status, WNOHANG) == 0 {
            if TestClock.now() > deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                return nil
            }
            usleep(5_000)
        }
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : -1
    }

    private static func spawn(_ arguments: [String], logFile: String) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, logFile, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        // Without this the server would inherit this process's sockets (tests run
        // in parallel) and keep other tests' connections alive after they close.
        // glibc >= 2.34 has it, but its declaration is not visible to Swift.
        if let closeFrom = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") {
            typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
            _ = unsafeBitCast(closeFrom, to: CloseFrom.self)(&actions, 3)
        }

        // The calling thread may be a pool thread with most signals blocked; the
        // child must start with none blocked and SIGTERM at its default action.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGTERM)
        sigaddset(&defaults, SIGINT)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawnp(&pid, arguments[0], &actions, &attributes, &argv, environ)
        guard rc == 0 else { throw Failure(description: "posix_spawnp \(arguments[0]) failed: errno \(rc)") }
        return pid
    }

    static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, 4096) }
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Accepts "12345" or "PORT 12345" with optional whitespace.
    private static func parsePort(_ text: String) -> Int? {
        let digits = text.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\r" || $0 == "\t" }).last
        guard let digits, let port = Int(digits), port > 0, port < 65536 else { return nil }
        return port
    }

    private static func removeWorkDir(_ dir: String) {
        for name in ["port", "server.log", "openssl.log", "cert.pem", "key.pem"] { unlink(dir + "/" + name) }
        rmdir(dir)
    }
}

// MARK: - Test utilities

enum TestClock {
    /// Monotonic seconds.
    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// Collects values from any thread; waits for them with a deadline.
final class TestCollector<Value: Sendable>: @unchecked Sendable {
    // `mutex` protects `values`; `condition` signals every `add`.
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var values: [Value] = []

    init() {
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func add(_ value: Value) {
        pthread_mutex_lock(&mutex)
        values.append(value)
        pthread_cond_broadcast(&condition)
        pthread_mutex_unlock(&mutex)
    }

    var all: [Value] {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return values
    }

    var count: Int { all.count }

    /// Waits until at least `count` values arrived; returns them, or nil on timeout.
    func wait(for count: Int, timeout: Double) -> [Value]? {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let whole = timeout.rounded(.down)
        deadline.tv_sec += Int(whole)
        deadline.tv_nsec += Int((timeout - whole) * 1e9)
        if deadline.tv_nsec >= 1_000_000_000 {
            deadline.tv_sec += 1
            deadline.tv_nsec -= 1_000_000_000
        }
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while values.count < count {
            if pthread_cond_timedwait(&condition, &mutex, &deadline) == ETIMEDOUT {
                return values.count >= count ? values : nil
            }
        }
        return values
    }

    func waitFirst(timeout: Double) -> Value? { wait(for: 1, timeout: timeout)?.first }
}

/// A read-only view of a parsed JSON document (jansson), enough for assertions.
final class TestJSON: @unchecked Sendable {
    // Immutable after init; `json` is owned (one reference) by the root, borrowed by children.
    private let json: UnsafeMutablePointer<json_t>
    private let owner: TestJSON?

    init?(parsing bytes: [UInt8]) {
        var error = json_error_t()
        let parsed = bytes.withUnsafeBytes { raw in
            json_loadb(raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count, Int(JSON_ALLOW_NUL), &error)
        }
        guard let parsed else { return nil }
        json = parsed
        owner = nil
    }

    private init(borrowed: UnsafeMutablePointer<json_t>, owner: TestJSON) {
        json = borrowed
        self.owner = owner
    }

    deinit {
        if owner == nil { json_decref(json) }
    }

    subscript(key: String) -> TestJSON? {
        guard let child = json_object_get(json, key) else { return nil }
        return TestJSON(borrowed: child, owner: owner ?? self)
    }

    var keys: [String] {
        var out: [String] = []
        var iter = json_object_iter(json)
        while let i = iter {
            out.append(String(cString: json_object_iter_key(i)))
            iter = json_object_iter_next(json, i)
        }
        return out
    }

    var string: String? {
        guard let s = json_string_value(json) else { return nil }
        return String(decoding: UnsafeRawBufferPointer(start: s, count: json_string_length(json)), as: UTF8.self)
    }

    var int: Int? {
        json.pointee.type == JSON_INTEGER ? Int(json_integer_value(json)) : nil
    }

    var isNull: Bool { json.pointee.type == JSON_NULL }
}

// MARK: - Transport test helpers

typealias TransportResult = Result<HTTPResponse, TransportError>

extension Result where Success == HTTPResponse, Failure == TransportError {
    var response: HTTPResponse? { if case .success(let r) = self { r } else { nil } }
    var error: TransportError? { if case .failure(let e) = self { e } else { nil } }
}

extension CurlTransport {
    /// Starts `request` and waits (bounded) for its completion.
    func perform(_ request: HTTPRequest, timeout: Double = 20) throws -> TransportResult {
        let box = TestCollector<TransportResult>()
        _ = start(request, progress: nil) { box.add($0) }
        guard let result = box.waitFirst(timeout: timeout) else {
            throw TestServer.Failure(description: "\(request.method) \(request.url) did not complete within \(timeout) s")
        }
        return result
    }
}

/// A local TCP port that accepts no connection: a listener whose accept queue
/// is full, so the kernel drops further SYNs and connecting hangs until timeout.
final class BlackholeListener {
    let port: Int
    private var fds: [Int32] = []

    init() throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw TestServer.Failure(description: "socket: errno \(errno)") }
        fds.append(listener)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p -> Int32 in
                guard bind(listener, p, length) == 0, listen(listener, 0) == 0 else { return -1 }
                return getsockname(listener, p, &length)
            }
        }
        guard bound == 0 else { throw TestServer.Failure(description: "bind/listen: errno \(errno)") }
        port = Int(UInt16(bigEndian: address.sin_port))
        // Fill the accept queue (backlog 0 admits one; a few more for safety).
        for _ in 0..<3 {
            let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard client >= 0 else { continue }
            fds.append(client)
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        usleep(50_000)  // let the handshakes land in the queue
    }

    deinit { for fd in fds { close(fd) } }
}

/// A port on 127.0.0.1 with nothing listening (bound, then closed).
func closedLocalPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw TestServer.Failure(description: "socket: errno \(errno)") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let rc = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p -> Int32 in
            guard bind(fd, p, length) == 0 else { return -1 }
            return getsockname(fd, p, &length)
        }
    }
    guard rc == 0 else { throw TestServer.Failure(description: "bind: errno \(errno)") }
    return Int(UInt16(bigEndian: address.sin_port))
}
