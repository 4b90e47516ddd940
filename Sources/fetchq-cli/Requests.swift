import ArgumentParser
import FetchQ
import Glibc

struct Get: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "GET one or more URLs in parallel; one JSON line per response.",
        discussion: """
            Each line: {"method", "url", "status", "headers" (with -i), "json" (a JSON \
            response, parsed) or "body" (text) or "body_base64" (other bytes), "metrics"}, \
            in completion order.

            A failed URL (network error, timeout, HTTP status other than 2xx) is reported \
            on stderr and the exit status is 1.

            Examples (test server: python3 Tests/support/testserver.py --port 8000):
              fetchq get 'http://127.0.0.1:8000/json?size=100' \\
                  http://127.0.0.1:8000/status/204 http://127.0.0.1:8000/
              fetchq get -i -H 'Accept: application/json' http://127.0.0.1:8000/gzip
              fetchq get --retry 3 'http://127.0.0.1:8000/flaky?key=help-get&fail=2'
              fetchq get --per-host 2 --priority high --timeout 5 \\
                  'http://127.0.0.1:8000/delay?ms=200' \\
                  'http://127.0.0.1:8000/delay?ms=100' 'http://127.0.0.1:8000/delay?ms=50'
            """)

    @OptionGroup var http: HTTPOptions
    @OptionGroup var common: CommonOptions
    @OptionGroup var input: InputOptions

    @Argument(help: "The URLs (http:// or https://).")
    var urls: [String] = []

    func validate() throws {
        guard !urls.isEmpty || !input.input.isEmpty else { throw ValidationError("give at least one URL") }
    }

    func run() throws {
        try runRequests(method: "GET", body: nil, contentType: nil, urls: try input.all(urls, "URL"), http: http,
                        common: common)
    }
}

struct Request: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send an HTTP request (any method, headers, body) to one or more URLs.",
        discussion: """
            The method is GET, or POST when a body is given (--data or --json). Output \
            and exit status as for `fetchq get`.

            Examples (test server: python3 Tests/support/testserver.py --port 8000):
              fetchq request -X PUT -H 'X-Trace: 42' --data 'hello' \\
                  http://127.0.0.1:8000/echo
              fetchq request --json '{"name": "fetchq", "tags": ["swift", "c"]}' \\
                  http://127.0.0.1:8000/echo
              fetchq request -X PURGE -i http://127.0.0.1:8000/echo
              fetchq request -X DELETE --retry 2 \\
                  'http://127.0.0.1:8000/flaky?key=help-delete&fail=1&status=503'
            """)

    @Option(name: [.customShort("X"), .long], help: "The HTTP method (default GET, or POST with a body).")
    var method: String?

    @Option(name: [.customShort("d"), .long],
            help: ArgumentHelp("The body, sent as is: a string, @FILE for a file's contents, @- for stdin (UTF-8 text). Repeated, the parts are joined with & (as curl does).",
                               valueName: "data"))
    var data: [String] = []

    @Option(help: ArgumentHelp("A JSON body (or @FILE, @-), sent with Content-Type: application/json unless -H sets it.",
                               valueName: "json"))
    var json: String?

    @OptionGroup var http: HTTPOptions
    @OptionGroup var common: CommonOptions
    @OptionGroup var input: InputOptions

    @Argument(help: "The URLs (http:// or https://).")
    var urls: [String] = []

    func validate() throws {
        guard !urls.isEmpty || !input.input.isEmpty else { throw ValidationError("give at least one URL") }
        guard data.isEmpty || json == nil else { throw ValidationError("give --data or --json, not both") }
        if input.input.contains("-") && (data.contains("@-") || json == "@-") {
            throw ValidationError("--input - and a body from @- would both read standard input")
        }
        guard data.filter({ $0 == "@-" }).count <= 1 else {
            throw ValidationError("--data @- is given twice: standard input can be read once")
        }
    }

    func run() throws {
        var body: JSONRef? = nil
        var contentType: String? = nil
        if !data.isEmpty {
            body = .string(try data.map { part throws in try Self.text(of: part, option: "--data") }.joined(separator: "&"))
        } else if let json {
            // Checked, then sent byte for byte as given (not re-encoded: that
            // would change numbers, spacing and duplicate keys).
            let text = try Self.text(of: json, option: "--json")
            do {
                _ = try JSONParser.parse(text, maxDepth: JSONParser.janssonMaxDepth)
            } catch {
                if error.kind == .unsupported {
                    throw ValidationError("--json: valid JSON that jansson cannot check (\(error)); "
                                          + "send it with --data and -H 'Content-Type: application/json'")
                }
                throw ValidationError("--json: \(error)")
            }
            body = .string(text)
            contentType = "application/json"
        }
        let method = self.method ?? (body == nil ? "GET" : "POST")
        try runRequests(method: method, body: body, contentType: contentType, urls: try input.all(urls, "URL"),
                        http: http, common: common)
    }

    /// The argument itself, or the contents of @FILE / @- (stdin).
    static func text(of argument: String, option: String) throws -> String {
        guard argument.hasPrefix("@") else { return argument }
        return try fileText(String(argument.dropFirst()), shown: argument, option: option,
                            refusal: "binary bodies are not supported")
    }

    /// The UTF-8 text of the file at `path` ("-": standard input). Errors
    /// name `option` and `shown` (the argument as the user typed it), and a
    /// file that is not UTF-8 is refused with `refusal` as the reason.
    static func fileText(_ path: String, shown argument: String, option: String, refusal: String) throws -> String {
        if path == "-" && Startup.stdinWasClosed {
            throw ValidationError("\(option) \(argument): standard input is closed")
        }
        let fd = path == "-" ? 0 : open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw ValidationError("\(option) \(argument): \(String(cString: strerror(errno)))")
        }
        defer { if fd != 0 { close(fd) } }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                bytes += chunk[0..<n]
            } else if n == 0 {
                break
            } else if errno != EINTR {
                throw ValidationError("\(option) \(argument): \(String(cString: strerror(errno)))")
            }
        }
        // The engine sends string bodies as text: refuse what would be altered.
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ValidationError("\(option) \(argument): not UTF-8 text (\(refusal))")
        }
        return text
    }
}

/// Submits one request per URL and prints one line per response.
/// `contentType` is sent unless a -H header sets one.
func runRequests(method: String, body: JSONRef?, contentType: String?, urls: [String], http: HTTPOptions,
                 common: CommonOptions) throws {
    var headers = try http.parsedHeaders()
    let setsContentType = http.headers.contains {
        $0.split(separator: ":", maxSplits: 1).first.map { String($0).trimmingBlanks.lowercased() } == "content-type"
    }
    if let contentType, !setsContentType {
        if headers == nil { headers = .object() }
        headers?.set("Content-Type", .string(contentType))
    }
    let include = http.include
    let session = try Session(common)
    session.progress.expect(urls.count)
    let options = session.operationOptions
    var submits: [Submit] = []
    for url in urls {
        let request = JSONRef.object()
        request.set("method", .string(method))
        request.set("url", .string(url))
        if let headers { request.set("headers", headers) }
        if let body { request.set("body", body) }
        let completion: Completion = { result in
            guard session.ended(result, label: "\(method) \(URLUtilities.redactingPassword(url))") else { return }
            session.console.result(responseLine(method: method, url: url, result, include: include))
        }
        submits.append { engine, queue in
            try withExtendedLifetime((request, options)) {
                try engine.submitRequest(request.pointer, to: queue, options: options.pointer, completion: completion)
            }
        }
    }
    try session.run(submits)
}

/// {"method", "url", "status", "headers"?, "json" | "body" | "body_base64", "metrics"}
func responseLine(method: String, url: String, _ result: OperationResult, include: Bool) -> JSONRef {
    let line = JSONRef.object()
    line.set("method", .string(method))
    line.set("url", .string(url))
    line.set("status", .integer(Int64(result.http?.status ?? 0)))
    if include { line.set("headers", result.http?.headers ?? .object()) }
    if let value = result.value {
        line.set("json", value)
    } else {
        let body = result.http?.body ?? []
        if let text = String(validating: body, as: UTF8.self) {
            line.set("body", .string(text))
        } else {
            line.set("body_base64", .string(base64(body)))
        }
    }
    if let metrics = result.http?.metrics { line.set("metrics", metrics) }
    return line
}

/// RFC 4648 base64 with padding.
func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    out.reserveCapacity((bytes.count + 2) / 3 * 4)
    var i = 0
    while i + 2 < bytes.count {
        let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
        out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
        i += 3
    }
    let rest = bytes.count - i
    if rest == 1 {
        let n = UInt32(bytes[i]) << 16
        out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], 61, 61]
    } else if rest == 2 {
        let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
        out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], 61]
    }
    return String(decoding: out, as: UTF8.self)
}
