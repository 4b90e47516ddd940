import CJansson

/// What a network operation's result carries besides the value.
public struct HTTPInfo: Sendable {
    /// 0 when no response arrived.
    public var status: Int = 0
    /// Response headers as an object (lower-cased names; repeated headers
    /// joined with ", "), nil when no response arrived.
    public var headers: JSONRef?
    public var body: [UInt8] = []
    public var metrics: JSONRef?
    public var fromCache = false
}

extension NetworkJob {
    /// Turns the transport's outcome into the operation's result. Runs on a
    /// worker (JSON parsing never runs on the network thread).
    func result(id: OpID, _ outcome: Result<HTTPResponse, TransportError>, queueWaitMs: Double,
                attempts: Int, cancelled: Bool, fromCache: Bool = false) -> OperationResult {
        switch outcome {
        case .failure(let error):
            var info = HTTPInfo()
            info.metrics = Self.metrics(nil, queueWaitMs: queueWaitMs, attempts: attempts)
            if cancelled || error.kind == .cancelled {
                return OperationResult(id: id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(id) was cancelled", value: nil, http: info)
            }
            return OperationResult(id: id, outcome: .failed, status: Self.status(of: error.kind),
                                   message: "\(request.method) \(request.url): \(error.message)", value: nil, http: info)
        case .success(let response):
            var info = HTTPInfo()
            info.status = response.status
            info.headers = Self.headers(response.headers)
            info.body = response.body
            info.metrics = Self.metrics(response.metrics, queueWaitMs: queueWaitMs, attempts: attempts)
            info.fromCache = fromCache
            info.metrics?.set("from_cache", JSONRef.bool(fromCache))
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

    static func headers(_ list: [(name: String, value: String)]) -> JSONRef {
        let object = JSONRef.object()
        for (name, value) in list {
            let key = name.lowercased()
            if let existing = json_object_get(object.pointer, key) {
                json_object_set_new(object.pointer, key, json_string(jsonString(existing) + ", " + value))
            } else {
                json_object_set_new(object.pointer, key, json_string(value))
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
        put("http_version", json_string(m?.httpVersion ?? ""))
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
