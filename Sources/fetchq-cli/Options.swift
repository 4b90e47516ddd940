import ArgumentParser
import FetchQ

/// Options every command takes: queue, limits and per-operation settings.
struct CommonOptions: ParsableArguments {
    // `parsing: .unconditional` on the numbers: "--concurrency -1" takes -1
    // and says what is wrong with it, instead of "missing value".
    @Option(parsing: .unconditional, help: ArgumentHelp("Operations running at once (the queue's max_concurrent).", valueName: "n"))
    var concurrency = 8

    @Option(name: .customLong("per-host"), parsing: .unconditional,
            help: ArgumentHelp("Requests running at once per host:port (engine config max_per_host; default 6).",
                               valueName: "n"))
    var perHost: Int?

    @Option(parsing: .unconditional,  // so that "--priority -4" takes -4
            help: ArgumentHelp("Priority of every operation: very-low, low, normal, high, very-high or -8, -4, 0, 4, 8.",
                               valueName: "name|n"))
    var priority: String?

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Time limit per attempt in seconds (each retry has its own), fractions allowed (option timeout_ms; 0 = none; default 60).",
                               valueName: "seconds"))
    var timeout: Double?

    @Option(parsing: .unconditional,
            help: ArgumentHelp("Retry a request up to n times on 408, 429, 500, 502, 503, 504, network errors and timeouts, with backoff (idempotent methods only).",
                               valueName: "n"))
    var retry: Int?

    @Option(help: ArgumentHelp("Cache mode passed to the engine as option \"cache\": default, reload, stale-while-revalidate (the cache is in memory for one run).",
                               valueName: "mode"))
    var cache: String?

    @Option(help: ArgumentHelp("Send requests through this proxy (option \"proxy\"); \"\" for none, whatever http_proxy and all_proxy say. Default: those environment variables, as curl reads them.",
                               valueName: "url"))
    var proxy: String?

    @Flag(help: "Never draw the progress bar (it is drawn only when stderr is a terminal).")
    var noProgress = false

    func validate() throws {
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1, got \(concurrency)") }
        if let timeout {
            guard timeout.isFinite, timeout >= 0, timeout <= 86_400 else {
                throw ValidationError("--timeout must be between 0 and 86400 seconds, got \(timeout)")
            }
        }
        if cache == "only-if-cached" {
            // Every operation of a run has the one mode, and the cache lives
            // for the run: nothing could ever have stored what it asks for.
            throw ValidationError("--cache only-if-cached would never answer: the CLI's cache is in memory for one run, and with this mode no request of the run stores anything in it")
        }
        if let cache, !["default", "reload", "stale-while-revalidate"].contains(cache) {
            throw ValidationError("--cache: \"\(cache)\" is not one of \"default\", \"reload\", \"stale-while-revalidate\"")
        }
    }

    /// The per-operation options these flags stand for. Values are passed as
    /// given: the engine checks them and its message is what the user sees.
    func operationOptions(progress: Bool) -> JSONRef {
        let options = JSONRef.object()
        if let priority {
            options.set("priority", Int64(priority).map { .integer($0) } ?? .string(priority))
        }
        if let timeout {
            // A limit under half a millisecond is 1 ms, not 0 (which means none).
            let ms = timeout == 0 ? 0 : max(1, Int64((timeout * 1000).rounded()))
            options.set("timeout_ms", .integer(ms))
        }
        if let retry {
            let policy = JSONRef.object()
            policy.set("max", .integer(Int64(retry)))
            options.set("retry", policy)
        }
        if let cache { options.set("cache", .string(cache)) }
        if let proxy { options.set("proxy", .string(proxy)) }
        if progress { options.set("progress", .bool(true)) }
        return options
    }
}

/// Options of the commands that send HTTP requests (get, request).
struct HTTPOptions: ParsableArguments {
    @Option(name: [.customShort("H"), .customLong("header")],
            help: ArgumentHelp("A request header \"Name: value\" (repeatable).", valueName: "header"))
    var headers: [String] = []

    @Flag(name: [.customShort("i"), .long], help: "Add the response headers to each output line (\"headers\").")
    var include = false

    func validate() throws { _ = try parsedHeaders() }

    /// The headers as a JSON object of strings. A name given again (in any
    /// case) joins its values in order with ", " (RFC 9110 §5.3), or "; "
    /// for Cookie (RFC 6265 §5.4), under the first spelling of the name.
    func parsedHeaders() throws -> JSONRef? {
        guard !headers.isEmpty else { return nil }
        var order: [String] = []
        var values: [String: (name: String, value: String)] = [:]
        for header in headers {
            guard let colon = header.firstIndex(of: ":") else {
                throw ValidationError("--header \"\(header)\": expected \"Name: value\"")
            }
            let name = String(header[..<colon]).trimmingBlanks
            guard !name.isEmpty else { throw ValidationError("--header \"\(header)\": the name is empty") }
            let value = String(header[header.index(after: colon)...]).trimmingBlanks
            let key = name.lowercased()
            if let earlier = values[key] {
                values[key] = (earlier.name, earlier.value + (key == "cookie" ? "; " : ", ") + value)
            } else {
                order.append(key)
                values[key] = (name, value)
            }
        }
        let object = JSONRef.object()
        for key in order {
            let header = values[key]!
            object.set(header.name, .string(header.value))
        }
        return object
    }
}

/// More URLs or queries, one per line, from a file or stdin: for lists too
/// long for the command line (swift-argument-parser 1.8.2 takes quadratic
/// time over a long list of arguments: about 2 s for 10 000).
struct InputOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Also read them from FILE (- for stdin), one per line; empty lines are skipped. "
                               + "Repeatable: files are read in the order given.", valueName: "file"))
    var input: [String] = []

    /// `given` followed by the lines of each --input file in turn (UTF-8; a
    /// byte order mark at the start and a trailing CR are dropped). `what`
    /// names them in the message when there are none.
    func all(_ given: [String], _ what: String) throws -> [String] {
        var list = given
        guard input.filter({ $0 == "-" }).count <= 1 else {
            throw ValidationError("--input - is given twice: standard input can be read once")
        }
        for path in input {
            let text = try Request.fileText(path, shown: path, option: "--input",
                                            refusal: "--input reads one URL or query per line as text")
            // By bytes: as Characters, "\r\n" is one and would not split at "\n".
            var bytes = Substring(text).utf8
            if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes = bytes.dropFirst(3) }  // "UTF-8 with BOM"
            for line in bytes.split(separator: UInt8(ascii: "\n")) {
                let item = line.last == UInt8(ascii: "\r") ? line.dropLast() : line
                if !item.isEmpty { list.append(String(decoding: item, as: UTF8.self)) }
            }
        }
        guard !list.isEmpty else { throw ValidationError("give at least one \(what)") }
        return list
    }
}

extension String {
    /// Without leading and trailing spaces and tabs.
    var trimmingBlanks: String {
        let blank: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = firstIndex(where: { !blank($0) }), let last = lastIndex(where: { !blank($0) }) else { return "" }
        return String(self[first...last])
    }
}
