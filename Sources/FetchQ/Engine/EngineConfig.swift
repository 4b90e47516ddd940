import CJansson
import Glibc

/// Engine configuration, parsed strictly from the JSON given to
/// fq_engine_new (every key documented in include/fetchq.h).
public struct EngineConfig: Sendable {
    public var delivery: DeliveryMode = .thread
    public var workers: Int = max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    /// Threads running transfers, each with its own libcurl multi handle;
    /// each ends its own cheap responses (see Engine.endsOnLoop).
    public var transferThreads: Int = 2
    public var agingMs: Int = 1000
    public var history: Int = 4096
    /// Of those, how many network operations keep their result (the newest).
    /// Kept small: freeing a parsed document long after it was made costs
    /// cache misses (P2 in bench/findings.md, fourth round: 256 cost about
    /// 30 % of throughput against 16-64).
    public var historyValues: Int = 32
    public var maxPerHost: Int = 6
    /// "off", "critical", "error", "warning", "notice", "info", "debug",
    /// "trace"; default from FETCHQ_LOG, else "warning".
    public var log: String = LogLevelName.fromEnvironment()
    public var network = NetworkLimits()
    public var search: SearchEndpoint? = nil
    /// Token buckets by host key ("host:port", "host" or "*").
    public var rateLimits: [String: (perSecond: Double, burst: Double)] = [:]
    /// HTTP cache size in bytes (0 = no cache) and optional SQLite file.
    public var cacheMaxBytes = 64 * 1024 * 1024
    public var cachePath: String? = nil

    public init() {}

    public init(json: UnsafePointer<json_t>?) throws(FetchQError) {
        var r = try OptionReader(json, context: "config")
        if let d = try r.choice("delivery", ["thread", "inline", "poll"]) {
            delivery = d == "poll" ? .poll : d == "inline" ? .inline : .thread
        }
        if let n = try r.int("workers", in: 1...256) { workers = n }
        if let n = try r.int("transfer_threads", in: 1...16) { transferThreads = n }
        if let n = try r.int("aging_ms", in: 0...86_400_000) { agingMs = n }
        if let n = try r.int("history", in: 0...1_000_000) { history = n }
        if let n = try r.int("history_values", in: 0...1_000_000) { historyValues = n }
        if let n = try r.int("max_per_host", in: 1...1024) { maxPerHost = n }
        if let l = try r.choice("log", LogLevelName.names.map(\.0)) { log = l }
        try network.read(&r)
        if let limits = r.value("rate_limits") {
            guard limits.pointee.type == JSON_OBJECT else { throw r.typeError("rate_limits", "an object of hosts", limits) }
            var iter = json_object_iter(limits)
            while let it = iter {
                let host = jsonKey(it)
                var limit = try OptionReader(json_object_iter_value(it), context: "config.rate_limits.\(host)")
                guard let perSecond = try limit.number("per_second", in: 0.001...1_000_000) else {
                    throw FetchQError(.invalid, "config.rate_limits.\(host): \"per_second\" is required")
                }
                let burst = try limit.number("burst", in: 1...1_000_000) ?? max(1, perSecond)
                try limit.finish()
                let key = host.lowercased()
                guard key == "*" || Self.isHostKey(host) else {
                    throw FetchQError(.invalid, "config.rate_limits: \"\(host)\" is not \"host\", \"host:port\" or \"*\"")
                }
                if rateLimits[key] != nil {
                    throw FetchQError(.invalid, "config.rate_limits: \"\(host)\" names the same host as another key (host names are compared without case)")
                }
                rateLimits[key] = (perSecond, burst)
                iter = json_object_iter_next(limits, it)
            }
        }
        if var c = try r.object("cache") {
            if let n = try c.int("max_bytes", in: 0...(1 << 40)) { cacheMaxBytes = n }
            if let p = try c.string("path") {
                guard !p.isEmpty else { throw FetchQError(.invalid, "\(c.path("path")): must not be empty (leave it out for a cache in memory only)") }
                cachePath = p
            }
            try c.finish()
        }
        if var s = try r.object("search") {
            search = try SearchEndpoint(reading: &s)
            try s.finish()
        }
        try r.finish()
    }
}

extension EngineConfig {
    /// A "rate_limits" key naming a host as URLs do: "host" or "host:port"
    /// (an IPv6 literal in brackets), nothing else of a URL, spelled as the
    /// scheduler names a request's host:port (`URLUtilities.hostOf`), since it
    /// looks keys up by that name alone: a key spelled otherwise ("h:" with an
    /// empty port, "h:080", "*:80", a host that is not ASCII, which no URL may
    /// have) would be accepted and never match. "h:80" and "h:443" stay: they
    /// name https://h:80 and http://h:443.
    static func isHostKey(_ key: String) -> Bool {
        guard !key.isEmpty, !key.contains(where: { "/?#@*".contains($0) }),
            key.utf8.allSatisfy({ $0 < 0x80 })
        else { return false }
        let name = key.lowercased()
        return URLUtilities.hostOf(url: "http://" + key + "/") == name
            || URLUtilities.hostOf(url: "https://" + key + "/") == name
    }
}

/// Limits for network operations: engine defaults, overridable per operation.
public struct NetworkLimits: Sendable {
    public var connectTimeoutMs = 10_000
    public var timeoutMs = 60_000
    public var maxWaitMs = 0
    public var maxRedirects = 5
    public var maxResponseBytes = 16 * 1024 * 1024
    public var maxJSONDepth = 512
    public var verifyTLS = true
    public var caFile: String? = nil
    /// nil: libcurl's proxy environment variables (http_proxy, https_proxy,
    /// all_proxy, no_proxy); "": no proxy; else the proxy's URL.
    public var proxy: String? = nil
    public var userAgent = "fetchq/\(fetchqVersionString)"

    mutating func read(_ r: inout OptionReader) throws(FetchQError) {
        if let n = try r.int("connect_timeout_ms", in: 0...3_600_000) { connectTimeoutMs = n }
        if let n = try r.int("timeout_ms", in: 0...86_400_000) { timeoutMs = n }
        if let n = try r.int("max_wait_ms", in: 0...86_400_000) { maxWaitMs = n }
        if let n = try r.int("max_redirects", in: 0...100) { maxRedirects = n }
        if let n = try r.int("max_response_bytes", in: 1...(1 << 40)) { maxResponseBytes = n }
        // jansson's own nesting limit is the most a document can have.
        if let n = try r.int("max_json_depth", in: 1...JSONParser.janssonMaxDepth) { maxJSONDepth = n }
        if let b = try r.bool("verify_tls") { verifyTLS = b }
        if let s = try r.string("ca_file") {
            guard !s.utf8.contains(0) else { throw FetchQError(.invalid, "\(r.path("ca_file")): must not contain NUL") }
            guard !s.isEmpty else {
                throw FetchQError(.invalid, "\(r.path("ca_file")): must not be empty (leave it out for the system store)")
            }
            caFile = s
        }
        if let s = try r.string("proxy") {
            guard s.isEmpty || URLUtilities.hostOf(url: s) != nil,
                  !s.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) else {
                throw FetchQError(.invalid, "\(r.path("proxy")): expected \"\" (no proxy) or an http:// or https:// URL with a host, got \"\(URLUtilities.redactingPassword(s))\"")
            }
            proxy = s
        }
        if let s = try r.string("user_agent") {
            guard !s.utf8.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) else {
                throw FetchQError(.invalid, "\(r.path("user_agent")): must not contain a control character (CR, LF, NUL or another)")
            }
            userAgent = s
        }
    }
}

/// The search endpoint: a URL template with {query} and JSON Pointers.
public struct SearchEndpoint: Sendable {
    public var url: String
    public var results = ""
    public var id = "/id"
    public var sort: String? = nil
    public var descending = true

    init(reading r: inout OptionReader) throws(FetchQError) {
        guard let url = try r.string("url") else {
            throw FetchQError(.invalid, "\(r.context): \"url\" is required")
        }
        try Self.checkTemplate(url, r.path("url"))
        self.url = url
        try override(&r)
    }

    /// A template must put {query} where it is sent: not only in the
    /// fragment ("#..."), which no request carries (every query would then
    /// send the same request).
    private static func checkTemplate(_ url: String, _ path: String) throws(FetchQError) {
        guard url.contains("{query}") else {
            throw FetchQError(.invalid, "\(path): the template must contain {query}")
        }
        guard url.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0].contains("{query}") else {
            throw FetchQError(.invalid, "\(path): {query} must stand before the fragment (\"#...\"), which is not sent")
        }
    }

    /// Applies the keys present in `r` (per-operation overrides).
    mutating func override(_ r: inout OptionReader) throws(FetchQError) {
        if let u = try r.string("url") {
            try Self.checkTemplate(u, r.path("url"))
            url = u
        }
        if let p = try pointer(&r, "results") { results = p }
        if let p = try pointer(&r, "id") { id = p }
        if let p = try pointer(&r, "sort") { sort = p }
        if let o = try r.choice("order", ["asc", "desc"]) { descending = o == "desc" }
    }

    private func pointer(_ r: inout OptionReader, _ key: StaticString) throws(FetchQError) -> String? {
        guard let p = try r.string(key) else { return nil }
        guard p.isEmpty || p.hasPrefix("/") else {
            throw FetchQError(.invalid, "\(r.path(key)): \"\(p)\" is not a JSON Pointer (RFC 6901: empty or starting with /)")
        }
        return p
    }
}

public let fetchqVersionMajor = 0
public let fetchqVersionMinor = 1
public let fetchqVersionPatch = 0
/// "MAJOR.MINOR.PATCH" as a static string (fq_version_string); a test checks
/// it against the numbers above and the header's macros.
public let fetchqVersionStaticString: StaticString = "0.1.0"
public let fetchqVersionString = fetchqVersionStaticString.description
public let fetchqVersionHex = UInt32((fetchqVersionMajor << 16) | (fetchqVersionMinor << 8) | fetchqVersionPatch)
