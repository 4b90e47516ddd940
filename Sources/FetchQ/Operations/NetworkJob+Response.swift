import CJansson
import Synchronization

/// What a network operation's result carries besides the value.
///
/// Headers and metrics are kept as Swift values and turned into jansson
/// objects on first read (most callers read neither; building both cost about
/// 30 allocations and 30 k instructions per response). The objects are built
/// once and then shared: every read returns the same `JSONRef`, so a pointer
/// handed to C stays valid as long as the result.
public struct HTTPInfo: Sendable {
    /// 0 when no response arrived.
    public var status: Int = 0
    public var fromCache = false
    /// The raw parts, shared by copies of this value.
    let details: HTTPDetails

    /// Response headers as an object (lower-cased names; repeated headers
    /// joined with ", "), nil when no response arrived. Built on first read.
    public var headers: JSONRef? { details.headers }
    public var body: [UInt8] { details.body }
    /// Timing and size (see `fq_result_metrics`). Built on first read.
    public var metrics: JSONRef? { details.metrics }

    /// A transfer that produced no response: metrics only.
    init(queueWaitMs: Double, attempts: Int) {
        details = HTTPDetails(response: nil, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: false)
    }

    init(_ response: HTTPResponse, queueWaitMs: Double, attempts: Int, fromCache: Bool) {
        status = response.status
        self.fromCache = fromCache
        details = HTTPDetails(response: response, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: fromCache)
    }

    /// The body at a stable address for the C ABI (`fq_result_body`), copied
    /// on first use; nil when the body is empty.
    var bodyBytes: UnsafeBufferPointer<UInt8>? { details.bodyBytes }
}

/// The response's raw parts, and the JSON objects (and C copy of the body)
/// made from them on first use.
final class HTTPDetails: Sendable {
    let headerList: [(name: String, value: String)]?
    let body: [UInt8]
    let transfer: TransferMetrics?
    let queueWaitMs: Double
    let attempts: Int
    let fromCache: Bool

    private struct Built {
        var headers: JSONRef?
        var metrics: JSONRef?
        var body: UnsafeMutableBufferPointer<UInt8>?
    }
    private let built = Mutex(Built())

    init(response: HTTPResponse?, queueWaitMs: Double, attempts: Int, fromCache: Bool) {
        headerList = response?.headers
        body = response?.body ?? []
        transfer = response?.metrics
        self.queueWaitMs = queueWaitMs
        self.attempts = attempts
        self.fromCache = fromCache
    }

    deinit {
        built.withLock { $0.body?.deallocate() }
    }

    var headers: JSONRef? {
        guard let headerList else { return nil }
        return built.withLock { b in
            if let h = b.headers { return h }
            let h = NetworkJob.headers(headerList)
            b.headers = h
            return h
        }
    }

    var metrics: JSONRef? {
        built.withLock { b in
            if let m = b.metrics { return m }
            let m = NetworkJob.metrics(transfer, queueWaitMs: queueWaitMs, attempts: attempts)
            // Only results with a response say where it came from.
            if headerList != nil { m.set("from_cache", JSONRef.bool(fromCache)) }
            b.metrics = m
            return m
        }
    }

    var bodyBytes: UnsafeBufferPointer<UInt8>? {
        guard !body.isEmpty else { return nil }
        return built.withLock { b in
            if let copy = b.body { return UnsafeBufferPointer(copy) }
            let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: body.count)
            _ = copy.initialize(from: body)
            b.body = copy
            return UnsafeBufferPointer(copy)
        }
    }
}

extension NetworkJob {
    /// Turns the transport's outcome into the operation's result. Runs on a
    /// worker (JSON parsing never runs on the network thread).
    func result(id: OpID, _ outcome: Result<HTTPResponse, TransportError>, queueWaitMs: Double,
                attempts: Int, cancelled: Bool, fromCache: Bool = false) -> OperationResult {
        switch outcome {
        case .failure(let error):
            let info = HTTPInfo(queueWaitMs: queueWaitMs, attempts: attempts)
            if cancelled || error.kind == .cancelled {
                return OperationResult(id: id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(id) was cancelled", value: nil, http: info)
            }
            return OperationResult(id: id, outcome: .failed, status: Self.status(of: error.kind),
                                   message: "\(request.method) \(request.url): \(error.message)", value: nil, http: info)
        case .success(let response):
            let info = HTTPInfo(response, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: fromCache)
            if cancelled {
                return OperationResult(id: id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(id) was cancelled", value: nil, http: info)
            }
            let accepted = accepts(response.status)
            var value: JSONRef? = nil
            var parseError: String? = nil
            if shouldParse(response) {
                do {
                    value = try JSONParser.parse(response.body, maxDepth: maxJSONDepth)
                } catch {
                    parseError = "\(request.url): the response is not valid JSON: \(error)"
                }
            }
            guard accepted else {
                return OperationResult(id: id, outcome: .failed, status: .http,
                                       message: "\(request.method) \(request.url): HTTP status \(response.status)",
                                       value: value, http: info)
            }
            if let parseError {
                return OperationResult(id: id, outcome: .failed, status: .parse, message: parseError, value: nil, http: info)
            }
            if let search, let document = value {
                do {
                    value = try search.value(from: document)
                } catch {
                    return OperationResult(id: id, outcome: .failed, status: .parse,
                                           message: "search \"\(search.query)\": \(error)", value: nil, http: info)
                }
                if let target = search.store, let items = value.flatMap({ SearchAllFamily.itemsPointer.resolve(in: $0) }) {
                    do {
                        let report = try target.store.upsert(collection: target.collection, items: items,
                                                             idPointer: search.id, merge: target.merge)
                        value?.set("store", report.json())
                    } catch {
                        return OperationResult(id: id, outcome: .failed, status: error.status,
                                               message: "search \"\(search.query)\": storing into \(target.store.path): \(error.message)",
                                               value: value, http: info)
                    }
                }
            }
            return OperationResult(id: id, outcome: .succeeded, status: .ok, message: nil, value: value, http: info)
        }
    }

    private func shouldParse(_ response: HTTPResponse) -> Bool {
        switch parse {
        case .none: return false
        case .json: return true
        case .auto:
            guard !response.body.isEmpty, let type = response.header("content-type")?.lowercased() else { return false }
            let mime = type.split(separator: ";").first.map { String($0).trimmingCharacters(in: " \t") } ?? ""
            return mime == "application/json" || (mime.hasPrefix("application/") && mime.hasSuffix("+json"))
        }
    }

    static func status(of kind: TransportError.Kind) -> FQStatus {
        switch kind {
        case .cancelled: .cancelled
        case .timeout: .timeout
        case .connect, .resolve, .network, .badContentEncoding: .network
        case .tooLarge: .tooLarge
        case .tooManyRedirects: .redirect
        case .tls: .tls
        case .invalidRequest: .invalid
        }
    }

    /// Keys and values go to jansson through withCString: passing a short
    /// Swift String where C wants a pointer built a heap copy for each.
    static func headers(_ list: [(name: String, value: String)]) -> JSONRef {
        let object = JSONRef.object()
        for (name, value) in list {
            name.lowercased().withCString { key in
                if let existing = json_object_get(object.pointer, key) {
                    (jsonString(existing) + ", " + value).withCString {
                        _ = json_object_set_new(object.pointer, key, json_string($0))
                    }
                } else {
                    value.withCString { _ = json_object_set_new(object.pointer, key, json_string($0)) }
                }
            }
        }
        return object
    }

    static func metrics(_ m: TransferMetrics?, queueWaitMs: Double, attempts: Int) -> JSONRef {
        let object = JSONRef.object()
        func put(_ key: String, _ v: UnsafeMutablePointer<json_t>?) { json_object_set_new(object.pointer, key, v) }
        put("queue_wait_ms", json_real(queueWaitMs))
        put("connect_ms", json_real(m?.connectMs ?? 0))
        put("first_byte_ms", json_real(m?.firstByteMs ?? 0))
        put("total_ms", json_real(m?.totalMs ?? 0))
        put("bytes", json_integer(json_int_t(m?.bytesReceived ?? 0)))
        put("redirects", json_integer(json_int_t(m?.redirects ?? 0)))
        put("http_version", (m?.httpVersion ?? "").withCString { json_string($0) })
        put("reused_connection", (m?.reusedConnection ?? false) ? json_true() : json_false())
        put("attempts", json_integer(json_int_t(attempts)))
        return object
    }
}

extension SearchJob {
    /// {"query": q, "items": [...], "count": N} from the parsed response.
    func value(from document: JSONRef) throws(JSONSearchError) -> JSONRef {
        var items = try JSONSearch.extractArray(from: document, at: results)
        if let sort { items = try JSONSearch.sortItems(items, by: sort, descending: descending) }
        let object = JSONRef.object()
        json_object_set_new(object.pointer, "query", json_stringn(query, query.utf8.count))
        json_object_set_new(object.pointer, "count", json_integer(json_int_t(json_array_size(items.pointer))))
        json_object_set(object.pointer, "items", items.pointer)
        return object
    }
}
