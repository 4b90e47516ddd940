import ArgumentParser
import FetchQ

/// Options every command takes: queue, limits and per-operation settings.
struct CommonOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Operations running at once (the queue's max_concurrent).", valueName: "n"))
    var concurrency = 8

    @Option(name: .customLong("per-host"),
            help: ArgumentHelp("Requests running at once per host:port (engine config max_per_host; default 6).",
                               valueName: "n"))
    var perHost: Int?

    @Option(parsing: .unconditional,  // so that "--priority -4" takes -4
            help: ArgumentHelp("Priority of every operation: very-low, low, normal, high, very-high or -8, -4, 0, 4, 8.",
                               valueName: "name|n"))
    var priority: String?

    @Option(help: ArgumentHelp("Time limit per request in seconds, fractions allowed (option timeout_ms; 0 = none; default 60).",
                               valueName: "seconds"))
    var timeout: Double?

    @Option(help: ArgumentHelp("Retry a request up to n times on 408, 429, 5xx, network errors and timeouts, with backoff (idempotent methods only).",
                               valueName: "n"))
    var retry: Int?

    @Option(help: ArgumentHelp("Cache mode passed to the engine as option \"cache\": default, reload, only-if-cached, stale-while-revalidate.",
                               valueName: "mode"))
    var cache: String?

    @Flag(help: "Never draw the progress bar (it is drawn only when stderr is a terminal).")
    var noProgress = false

    func validate() throws {
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1, got \(concurrency)") }
        if let timeout {
            guard timeout.isFinite, timeout >= 0, timeout <= 86_400 else {
                throw ValidationError("--timeout must be between 0 and 86400 seconds, got \(timeout)")
            }
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

    /// The headers as a JSON object of strings (a repeated name keeps the last value).
    func parsedHeaders() throws -> JSONRef? {
        guard !headers.isEmpty else { return nil }
        let object = JSONRef.object()
        for header in headers {
            guard let colon = header.firstIndex(of: ":") else {
                throw ValidationError("--header \"\(header)\": expected \"Name: value\"")
            }
            let name = String(header[..<colon]).trimmingBlanks
            guard !name.isEmpty else { throw ValidationError("--header \"\(header)\": the name is empty") }
            object.set(name, .string(String(header[header.index(after: colon)...]).trimmingBlanks))
        }
        return object
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
