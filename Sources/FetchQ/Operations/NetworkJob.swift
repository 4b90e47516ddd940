import CJansson
import Glibc

/// A network operation, validated at submit: the HTTP request to send and
/// how to turn its response into a result.
public struct NetworkJob: Sendable {
    public enum Parse: String, Sendable { case auto, json, none }

    var request: HTTPRequest
    /// host:port, for the per-host limit.
    var host: String
    var parse: Parse = .auto
    /// Option "lazy_parse": check the body at the end of the transfer, parse
    /// it into a value only when the value is first read.
    var lazyParse = false
    /// Option "marshal": also keep the parsed body in CPython's marshal
    /// format (`fq_result_marshal`), written by the walk that checks it.
    var marshal = false
    /// Statuses that count as success (default 200...299).
    var accept: [ClosedRange<Int>] = [200...299]
    var maxJSONDepth: Int
    /// Progress events every so often, or nil for none.
    var progressIntervalMs: Int? = nil
    /// For searches: what to extract and how to sort.
    var search: SearchJob? = nil
    var retry = RetryPolicy()
    /// Share one transfer with identical in-flight GETs (option "coalesce").
    var coalesce = true
    var cache = CacheMode.default

    /// Option "cache": how the HTTP cache is used (GETs without a body only).
    enum CacheMode: String, Sendable, CaseIterable {
        /// Fresh entries answer at once; stale ones are revalidated.
        case `default` = "default"
        /// Always ask the server; store the answer.
        case reload = "reload"
        /// Answer from the cache (fresh or stale) or fail with FQ_ERR_CACHE_MISS.
        case onlyIfCached = "only-if-cached"
        /// Deliver any entry at once as an update event, then ask the server.
        case staleWhileRevalidate = "stale-while-revalidate"
    }

    /// The HTTP cache key (`HTTPCache.key`), or nil when the cache does not
    /// apply. How the response may be obtained is part of it when it differs
    /// from the default: a response fetched without TLS verification, or
    /// trusted through another CA file, never answers a request that
    /// verifies with the defaults, and a redirect kept with redirects not
    /// followed never answers one that follows. (Lines starting with ":"
    /// cannot be header lines: ":" is not allowed in a header name.)
    var cacheKey: String? {
        guard request.method == "GET", request.body == nil else { return nil }
        var key = HTTPCache.key(method: "GET", url: request.url, headers: request.headers)
        if !request.verifyTLS { key += "\n:verify-tls: false" }
        if let ca = request.caFile { key += "\n:ca-file: " + ca }
        if let proxy = request.proxy { key += "\n:proxy: " + proxy }
        if !request.followRedirects { key += "\n:follow-redirects: false" }
        // The User-Agent is sent like any header (an answer may Vary on it).
        key += "\n:user-agent: " + request.userAgent
        return key
    }

    /// The request's own Cache-Control header (directives to the cache).
    /// Without one, `Pragma: no-cache` stands for `Cache-Control: no-cache`
    /// (RFC 7234 §5.4; RFC 9111 deprecates Pragma but HTTP/1.0 clients send it).
    var requestCacheControl: String? {
        if let value = request.headers.first(where: { TransportText.equalsIgnoringASCIICase($0.name, "cache-control") })?.value {
            return value
        }
        guard let pragma = request.headers.first(where: { TransportText.equalsIgnoringASCIICase($0.name, "pragma") })?.value,
              pragma.split(separator: ",").contains(where: { TransportText.equalsIgnoringASCIICase(String($0.trimmingSpaces), "no-cache") })
        else { return nil }
        return "no-cache"
    }

    /// Identical requests (same URL, headers and limits) share a transfer; nil when this
    /// one must not (see CoalesceKey). `maxWaitMs` is the submit's "max_wait_ms".
    func coalesceKey(maxWaitMs: Int) -> CoalesceKey? {
        // only-if-cached never reaches the network; stale-while-revalidate
        // gives each caller its own update event: neither is shared.
        guard coalesce, request.method == "GET", request.body == nil,
              cache == .default || cache == .reload else { return nil }
        var headers: [ExactString] = []
        if !request.headers.isEmpty {
            let lowered = request.headers.map { (name: $0.name.lowercased(), value: $0.value) }
            for (name, value) in lowered.sorted(by: { $0.name < $1.name }) {
                headers.append(ExactString(name))
                headers.append(ExactString(value))
            }
        }
        return CoalesceKey(.init(url: ExactString(request.url), headers: headers,
                           connectTimeoutMs: request.connectTimeoutMs,
                           timeoutMs: request.timeoutMs, followRedirects: request.followRedirects,
                           maxRedirects: request.maxRedirects, maxResponseBytes: request.maxResponseBytes,
                           verifyTLS: request.verifyTLS, caFile: request.caFile.map(ExactString.init),
                           proxy: request.proxy.map(ExactString.init), userAgent: ExactString(request.userAgent),
                           progressIntervalMs: progressIntervalMs, cache: cache, maxWaitMs: maxWaitMs,
                           retry: retry.max > 0 ? retry : nil))
    }

    func accepts(_ status: Int) -> Bool { accept.contains { $0.contains(status) } }
}

/// A search: the query and the endpoint's pointers.
struct SearchJob: Sendable {
    var query: String
    var results: JSONPointer
    var id: JSONPointer
    var sort: JSONPointer?
    var descending: Bool
    var store: StoreTarget? = nil
}

/// Search option "store": where extracted items are upserted by id.
struct StoreTarget: Sendable {
    var store: ItemStore
    var collection: String
    var merge: ItemStore.Merge

    init(reading r: inout OptionReader, open: (String) throws(FetchQError) -> ItemStore) throws(FetchQError) {
        guard let path = try r.string("path"), !path.isEmpty else {
            throw FetchQError(.invalid, "\(r.context): \"path\" (the SQLite file) is required")
        }
        guard let collection = try r.string("collection"), !collection.isEmpty else {
            throw FetchQError(.invalid, "\(r.context): \"collection\" is required")
        }
        self.collection = collection
        merge = ItemStore.Merge(rawValue: try r.choice("merge", ItemStore.Merge.allCases.map(\.rawValue)) ?? "overwrite")!
        try r.finish()
        store = try open(path)
    }
}

extension NetworkJob {
    /// `fq_submit_request`: `request` holds method, url, headers, query, body;
    /// `options` the per-operation keys (common ones already read).
    static func makeRequest(_ json: UnsafePointer<json_t>?, options r: inout OptionReader,
                            config: EngineConfig) throws(FetchQError) -> NetworkJob {
        var (template, url) = try RequestTemplate.read(json, urlGiven: true, options: &r, config: config)
        // The URL is checked before the response options are read (which
        // error a request with several reports).
        var job = try template.job(url: url!)
        try template.readResponseOptions(&r)
        template.applyResponseOptions(to: &job)
        return job
    }

    /// `fq_submit_search`: the query goes into the endpoint's URL template.
    static func makeSearch(_ query: String, options r: inout OptionReader, config: EngineConfig,
                           openStore: (String) throws(FetchQError) -> ItemStore) throws(FetchQError) -> NetworkJob {
        try SearchTemplate(reading: &r, config: config, openStore: openStore).job(for: query)
    }
}

/// A request object and its options, read once; `job(url:)` makes the
/// operation for one URL (`fq_submit_requests` makes one per URL).
struct RequestTemplate {
    var method: String
    var headers: [(name: String, value: String)]
    /// The "query" items, URL-encoded ("" without any).
    var query: String
    var body: [UInt8]?
    var settings: NetworkSettings
    var parse: NetworkJob.Parse? = nil
    var lazyParse: Bool? = nil
    var marshal: Bool? = nil
    var accept: [ClosedRange<Int>] = []

    /// Reads the request object and the network options. `urlGiven`: the
    /// request must hold "url" (returned); otherwise it must not (the URLs
    /// come one per operation).
    static func read(_ json: UnsafePointer<json_t>?, urlGiven: Bool, options r: inout OptionReader,
                     config: EngineConfig) throws(FetchQError) -> (RequestTemplate, String?) {
        guard json != nil || !urlGiven else {
            throw FetchQError(.invalid, "request: NULL (expected an object with at least \"url\")")
        }
        var q = try OptionReader(json, context: "request")
        let method = try q.string("method") ?? "GET"
        guard !method.isEmpty, method.utf8.allSatisfy(isTokenByte) else {
            throw FetchQError(.invalid, "request.method: \"\(method)\" is not an HTTP method token")
        }
        let url = try q.string("url")
        if urlGiven {
            guard url != nil else { throw FetchQError(.invalid, "request: \"url\" is required") }
        } else if url != nil {
            throw FetchQError(.invalid, "request.url: not allowed here (each operation's URL is given in urls[])")
        }
        var headers: [(name: String, value: String)] = []
        if let h = q.value("headers") {
            guard h.pointee.type == JSON_OBJECT else { throw q.typeError("headers", "an object of strings", h) }
            var iter = json_object_iter(h)
            while let it = iter {
                let name = jsonKey(it)
                let v = json_object_iter_value(it)!
                guard v.pointee.type == JSON_STRING else {
                    throw FetchQError(.invalid, "request.headers.\(name): expected a string, got \(jsonTypeName(v))")
                }
                headers.append((name, jsonString(v)))
                iter = json_object_iter_next(h, it)
            }
        }
        var query = ""
        if let items = q.value("query") {
            guard items.pointee.type == JSON_OBJECT else { throw q.typeError("query", "an object", items) }
            var pairs: [(String, String)] = []
            var iter = json_object_iter(items)
            while let it = iter {
                let name = jsonKey(it)
                let v = json_object_iter_value(it)!
                let text: String
                switch v.pointee.type {
                case JSON_STRING: text = jsonString(v)
                case JSON_INTEGER: text = String(json_integer_value(v))
                case JSON_REAL: text = String(json_real_value(v))
                case JSON_TRUE: text = "true"
                case JSON_FALSE: text = "false"
                default:
                    throw FetchQError(.invalid, "request.query.\(name): expected a string, number or boolean, got \(jsonTypeName(v))")
                }
                pairs.append((name, text))
                iter = json_object_iter_next(items, it)
            }
            if !pairs.isEmpty { query = URLUtilities.encodeQueryItems(pairs) }
        }
        var body: [UInt8]? = nil
        if let b = q.value("body") {
            if b.pointee.type == JSON_STRING {
                body = Array(jsonString(b).utf8)
            } else {
                guard let text = json_dumps(b, Int(JSON_COMPACT | JSON_ENCODE_ANY)) else {
                    throw FetchQError(.invalid, "request.body: cannot be serialized")
                }
                body = Array(String(cString: text).utf8)
                free(text)
                if !headers.contains(where: { $0.name.lowercased() == "content-type" }) {
                    headers.append(("Content-Type", "application/json"))
                }
            }
        }
        try q.finish()
        let settings = try NetworkSettings(reading: &r, config: config)
        return (RequestTemplate(method: method, headers: headers, query: query, body: body, settings: settings), url)
    }

    /// "parse", "lazy_parse", "marshal" and "accept_status".
    mutating func readResponseOptions(_ r: inout OptionReader) throws(FetchQError) {
        if let p = try r.choice("parse", ["auto", "json", "none"]) { parse = NetworkJob.Parse(rawValue: p)! }
        if let lazy = try r.bool("lazy_parse") { lazyParse = lazy }
        if let m = try r.bool("marshal") { marshal = m }
        if let v = r.value("accept_status") { accept = try NetworkJob.acceptList(v, r.path("accept_status")) }
    }

    func applyResponseOptions(to job: inout NetworkJob) {
        if let parse { job.parse = parse }
        if let lazyParse { job.lazyParse = lazyParse }
        if let marshal { job.marshal = marshal }
        job.accept += accept
    }

    /// The operation for `url` (checked: absolute http(s), no space or
    /// control character), without the response options.
    func job(url: String) throws(FetchQError) -> NetworkJob {
        var url = url
        if !query.isEmpty {
            let (base, fragment) = Self.splitFragment(url)
            url = base + (base.contains("?") ? (base.hasSuffix("?") || base.hasSuffix("&") ? "" : "&") : "?") + query + fragment
        }
        return try settings.job(url: url, method: method, headers: headers, body: body)
    }

    private static func splitFragment(_ url: String) -> (String, String) {
        guard let hash = url.firstIndex(of: "#") else { return (url, "") }
        return (String(url[..<hash]), String(url[hash...]))
    }
}

/// A search's endpoint, pointers and network settings, read once from the
/// options; `job(for:)` makes the operation for one query.
struct SearchTemplate: Sendable {
    var endpoint: SearchEndpoint
    var results: JSONPointer
    var id: JSONPointer
    var sort: JSONPointer?
    var settings: NetworkSettings
    var store: StoreTarget?

    init(reading r: inout OptionReader, config: EngineConfig,
         openStore: (String) throws(FetchQError) -> ItemStore) throws(FetchQError) {
        if var configured = config.search {
            try configured.override(&r)
            endpoint = configured
        } else if r.has("url") {
            endpoint = try SearchEndpoint(reading: &r)
        } else {
            throw FetchQError(.invalid, "no search endpoint: set config \"search\" or option \"url\"")
        }
        results = try Self.pointer(endpoint.results, "results")
        id = try Self.pointer(endpoint.id, "id")
        sort = try endpoint.sort.map { p throws(FetchQError) in try Self.pointer(p, "sort") }
        settings = try NetworkSettings(reading: &r, config: config)
        if var s = try r.object("store") { store = try StoreTarget(reading: &s, open: openStore) }
    }

    private static func pointer(_ text: String, _ key: String) throws(FetchQError) -> JSONPointer {
        do {
            return try JSONPointer(text)
        } catch {
            throw FetchQError(.invalid, "search.\(key): \(error)")
        }
    }

    func job(for query: String) throws(FetchQError) -> NetworkJob {
        let url: String
        do {
            url = try URLUtilities.expandTemplate(endpoint.url, query: query)
        } catch {
            throw FetchQError(.invalid, "search url: \(error)")
        }
        var job = try settings.job(url: url, method: "GET", headers: [], body: nil)
        job.parse = .json
        job.search = SearchJob(query: query, results: results, id: id, sort: sort, descending: endpoint.descending,
                               store: store)
        return job
    }
}

/// Per-operation network limits and progress, read from the options.
struct NetworkSettings: Sendable {
    var limits: NetworkLimits
    var progressIntervalMs: Int?
    var retry = RetryPolicy()
    var coalesce = true
    var cache = NetworkJob.CacheMode.default

    init(reading r: inout OptionReader, config: EngineConfig) throws(FetchQError) {
        limits = config.network
        try limits.read(&r)
        let progress = try r.bool("progress")
        let interval = try r.int("progress_interval_ms", in: 0...60_000)
        // An interval turns progress on: with "progress": false beside it, one
        // of the two would be ignored.
        if progress == false && interval != nil {
            throw FetchQError(.invalid, "\(r.path("progress_interval_ms")) turns progress events on, and \(r.path("progress")) is false")
        }
        if progress == true || interval != nil { progressIntervalMs = interval ?? 100 }
        if var r = try r.object("retry") { retry = try RetryPolicy(reading: &r) }
        if let c = try r.bool("coalesce") { coalesce = c }
        if let m = try r.choice("cache", NetworkJob.CacheMode.allCases.map(\.rawValue)) { cache = NetworkJob.CacheMode(rawValue: m)! }
        // Never answered otherwise: refused rather than sent to the server.
        if cache == .onlyIfCached && config.cacheMaxBytes == 0 {
            throw FetchQError(.invalid, "\(r.path("cache")): \"only-if-cached\" needs the engine's HTTP cache, which config \"cache\" turns off (max_bytes 0)")
        }
    }

    /// The most a request's URL and headers may hold together: libcurl
    /// builds the request head in a buffer of 1 MiB and fails a larger one
    /// as "out of memory" (curl error 27), which is no network error.
    static let maxRequestHeadBytes = 1_000_000

    /// Checks the URL and headers and applies the limits.
    func job(url: String, method: String, headers: [(name: String, value: String)],
             body: [UInt8]?) throws(FetchQError) -> NetworkJob {
        var url = url
        let (host, plain, ascii) = url.withUTF8 { bytes in
            var plain = true, ascii = true  // one pass over the bytes for both
            for b in bytes {
                if b <= 0x20 || b == 0x7F { plain = false }
                if b >= 0x80 { ascii = false }
            }
            return (URLUtilities.hostOf(utf8: bytes), plain, ascii)
        }
        guard let host else {
            throw FetchQError(.invalid, "url \"\(URLUtilities.redactingPassword(url))\": only absolute http:// and https:// URLs with a host are allowed")
        }
        // Spaces and control characters must be percent-encoded: refused
        // here, at submit, rather than by the transport later.
        guard plain else {
            throw FetchQError(.invalid, "url \"\(URLUtilities.redactingPassword(url))\": contains a space or a control character (percent-encode it)")
        }
        if !ascii {
            // libcurl here resolves no internationalized names.
            guard host.utf8.allSatisfy({ $0 < 0x80 }) else {
                throw FetchQError(.invalid, "url \"\(URLUtilities.redactingPassword(url))\": the host is not ASCII (write an internationalized name in its xn-- form)")
            }
            url = URLUtilities.encodingNonASCII(url)
        }
        var headBytes = url.utf8.count + method.utf8.count + limits.userAgent.utf8.count
        for (name, value) in headers {
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenByte) else {
                throw FetchQError(.invalid, "header name \"\(name)\" is not a valid HTTP token")
            }
            // RFC 9110 §5.5: no control character but HTAB in a field value.
            guard !value.utf8.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) else {
                throw FetchQError(.invalid, "header \"\(name)\": the value contains a control character (CR, LF, NUL or another)")
            }
            // The message's framing is fetchq's, from the body: a caller's
            // own would let the body be read as another request (smuggling).
            if TransportText.equalsIgnoringASCIICase(name, "content-length")
                || TransportText.equalsIgnoringASCIICase(name, "transfer-encoding") {
                throw FetchQError(.invalid, "header \"\(name)\": set by fetchq from the body, it cannot be given")
            }
            headBytes += name.utf8.count + value.utf8.count + 4
        }
        guard headBytes <= Self.maxRequestHeadBytes else {
            throw FetchQError(.invalid, "the request's URL and headers hold \(headBytes) bytes, over the limit of \(Self.maxRequestHeadBytes)")
        }
        if body != nil && (method == "HEAD" || method == "TRACE") {
            throw FetchQError(.invalid, "a \(method) request cannot have a body")
        }
        if method == "CONNECT" {
            throw FetchQError(.invalid, "method CONNECT is not supported (fetchq opens no tunnels)")
        }
        // RFC 9110 §8.6: a PUT or PATCH says its (empty) length, as a POST does.
        let body = body == nil && (method == "PUT" || method == "PATCH") ? [] : body
        // The cache serves only a GET without a body: another mode for
        // another request would be ignored (only-if-cached would go to
        // the server), so it is refused.
        if cache != .default && (method != "GET" || body != nil) {
            throw FetchQError(.invalid, "options.cache: \"\(cache.rawValue)\" applies only to a GET without a body, not to "
                              + (method == "GET" ? "a GET with a body" : "a \(method)"))
        }
        var request = HTTPRequest(method: method, url: url, headers: headers, body: body)
        request.connectTimeoutMs = limits.connectTimeoutMs
        request.timeoutMs = limits.timeoutMs
        request.followRedirects = limits.maxRedirects > 0
        request.maxRedirects = limits.maxRedirects
        request.maxResponseBytes = limits.maxResponseBytes
        request.verifyTLS = limits.verifyTLS
        request.caFile = limits.caFile
        request.proxy = limits.proxy
        request.userAgent = limits.userAgent
        var job = NetworkJob(request: request, host: host, maxJSONDepth: limits.maxJSONDepth)
        job.progressIntervalMs = progressIntervalMs
        job.request.progressIntervalMs = progressIntervalMs ?? 0
        job.retry = retry
        job.coalesce = coalesce
        job.cache = cache
        return job
    }
}

extension NetworkJob {
    /// accept_status: an array of statuses (404) and classes ("4xx").
    static func acceptList(_ v: UnsafeMutablePointer<json_t>, _ path: String) throws(FetchQError) -> [ClosedRange<Int>] {
        guard v.pointee.type == JSON_ARRAY else {
            throw FetchQError(.invalid, "\(path): expected an array of statuses like 404 or \"4xx\", got \(jsonTypeName(v))")
        }
        var ranges: [ClosedRange<Int>] = []
        for i in 0..<json_array_size(v) {
            let item = json_array_get(v, i)!
            if item.pointee.type == JSON_INTEGER, (100...599).contains(json_integer_value(item)) {
                let s = Int(json_integer_value(item))
                ranges.append(s...s)
            } else if item.pointee.type == JSON_STRING,
                      case let s = jsonString(item), s.count == 3, s.hasSuffix("xx"),
                      let d = Int(s.prefix(1)), (1...5).contains(d) {
                ranges.append((d * 100)...(d * 100 + 99))
            } else {
                throw FetchQError(.invalid, "\(path)[\(i)]: expected a status 100...599 or a class like \"4xx\"")
            }
        }
        return ranges
    }
}

/// RFC 9110 tchar.
func isTokenByte(_ b: UInt8) -> Bool {
    switch b {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    default:
        return "!#$%&'*+-.^_`|~".utf8.contains(b)
    }
}

/// What identical GETs must share to share a transfer: the URL, the headers (names
/// lower-cased, sorted by name; as name, value, name, value...), every limit that shapes
/// the transfer, the cache mode, and the callers' "max_wait_ms". Compared field by
/// field; hashed once, when made, outside the engine lock (building this as one text
/// and hashing it under the lock cost about 8 k instructions per search submitted).
struct CoalesceKey: Hashable, Sendable {
    /// Strings by their bytes (`ExactString`): header values that differ
    /// only in Unicode form are two requests to a server.
    struct Fields: Hashable, Sendable {
        var url: ExactString
        var headers: [ExactString]
        var connectTimeoutMs: Int
        var timeoutMs: Int
        var followRedirects: Bool
        var maxRedirects: Int
        var maxResponseBytes: Int
        var verifyTLS: Bool
        var caFile: ExactString?
        var proxy: ExactString?
        var userAgent: ExactString
        var progressIntervalMs: Int?
        var cache: NetworkJob.CacheMode
        var maxWaitMs: Int
        /// The "retry" a joiner would otherwise lose (nil: none, the usual case).
        var retry: RetryPolicy?
    }

    let fields: Fields
    private let hash: Int

    init(_ fields: Fields) {
        self.fields = fields
        hash = fields.hashValue
    }

    static func == (a: CoalesceKey, b: CoalesceKey) -> Bool { a.hash == b.hash && a.fields == b.fields }

    func hash(into hasher: inout Hasher) { hasher.combine(hash) }
}
