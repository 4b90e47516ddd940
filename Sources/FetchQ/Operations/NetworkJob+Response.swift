import CFetchQSupport
import CJansson
import Glibc
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
    var details: HTTPDetails

    /// Response headers as an object (lower-cased names; repeated headers
    /// joined with ", "), nil when no response arrived. Built on first read.
    public var headers: JSONRef? { details.headers }
    public var body: [UInt8] { details.body }
    /// Timing and size (see `fq_result_metrics`). Built on first read.
    public var metrics: JSONRef? { details.metrics }
    /// The body was checked as JSON (at this depth limit) and its value is
    /// parsed on first read, by and for each result that carries this
    /// (`OperationResult.value`): option "lazy_parse", and the history form
    /// of a result (`OperationResult.historyForm`). nil otherwise.
    var lazyValueDepth: Int? = nil
    /// The body parsed now, at `lazyValueDepth` (nil without it): a new
    /// value on every call.
    var parsedBody: JSONRef? { lazyValueDepth.flatMap { details.parsedBody(maxDepth: $0) } }

    /// A transfer that produced no response: metrics only (what curl
    /// measured before it failed, if it ran).
    init(queueWaitMs: Double, attempts: Int, measured: TransferMetrics? = nil) {
        details = HTTPDetails(response: nil, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: false,
                              measured: measured)
    }

    /// `marshal`: a buffer from `fqs_json_marshal` (malloc'd), now owned
    /// by the result.
    init(_ response: HTTPResponse, queueWaitMs: Double, attempts: Int, fromCache: Bool,
         marshal: UnsafeMutableBufferPointer<UInt8>? = nil) {
        status = response.status
        self.fromCache = fromCache
        details = HTTPDetails(response: response, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: fromCache,
                              marshal: marshal)
    }

    /// The body at a stable address for the C ABI (`fq_result_body`); nil
    /// when the body is empty.
    var bodyBytes: UnsafeBufferPointer<UInt8>? { details.bodyBytes }
    /// Option "marshal": the parsed body in CPython's marshal format
    /// (`fq_result_marshal`); nil without the option or when it could not be
    /// written that way.
    var marshalBytes: UnsafeBufferPointer<UInt8>? { details.marshal.map { UnsafeBufferPointer($0) } }
}

/// The response's raw parts, and the JSON objects made from them on first use.
///
/// Each built part is published with a compare-and-swap on an atomic word (`JSONRef.published`)
/// (the address of a retained `JSONRef`, or of the body copy): the first
/// thread to publish wins, a thread that lost the race frees its own copy and
/// uses the winner's. Atomics rather than `Mutex`, which ThreadSanitizer
/// cannot see into (see `Locked`), and rather than `Locked`, which would cost
/// two more allocations per result.
///
/// `fq_result_body` hands out the body at an address that never moves. A
/// body of up to `eagerCopyLimit` bytes is copied there when the result is
/// made, on the thread that received it, while the bytes are still in that
/// core's cache: copying it on the first `fq_result_body` cost a binding's
/// thread 2.4 µs per 3 KB response (bench/findings.md, "Seventh round"). A
/// larger body stays in its array until the first `bodyBytes` copies it
/// (published like the built parts): copying megabytes that nobody may read
/// would cost more than it saves.
final class HTTPDetails: Sendable {
    static let eagerCopyLimit = 64 * 1024
    let headerList: [(name: String, value: String)]?
    /// A body of up to `eagerCopyLimit` bytes; nil when empty or larger.
    /// Immutable after init.
    nonisolated(unsafe) private let storage: UnsafeMutableBufferPointer<UInt8>?
    /// A larger body; empty otherwise.
    private let largeBody: [UInt8]
    /// Option "marshal": the parsed body in marshal's format (malloc'd by
    /// `fqs_json_marshal`, freed with the result). Immutable after init.
    nonisolated(unsafe) let marshal: UnsafeMutableBufferPointer<UInt8>?
    /// 0, or the bit pattern of `largeBody`'s copy (`largeBody.count` bytes).
    private let builtBody = Atomic<UInt>(0)
    let transfer: TransferMetrics?
    let queueWaitMs: Double
    let attempts: Int
    let fromCache: Bool

    /// The next on a `ReleaseList`'s stack of response parts handed back
    /// (used only while on it).
    let nextReturned = Atomic<UInt>(0)
    /// On such a stack now (set by the push that links it, cleared by the
    /// thread that takes it off): one object is on one stack at most.
    let onReturnedStack = Atomic<Bool>(false)
    /// 0, or the bit pattern of an `Unmanaged<JSONRef>` holding one retain.
    private let builtHeaders = Atomic<UInt>(0)
    private let builtMetrics = Atomic<UInt>(0)

    init(response: HTTPResponse?, queueWaitMs: Double, attempts: Int, fromCache: Bool,
         marshal: UnsafeMutableBufferPointer<UInt8>? = nil, measured: TransferMetrics? = nil) {
        headerList = response?.headers
        self.marshal = marshal
        let body = response?.body ?? []
        if body.count > Self.eagerCopyLimit {
            storage = nil
            largeBody = body
        } else if body.isEmpty {
            storage = nil
            largeBody = []
        } else {
            let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: body.count)
            _ = copy.initialize(from: body)
            storage = copy
            largeBody = []
        }
        transfer = response?.metrics ?? measured
        self.queueWaitMs = queueWaitMs
        self.attempts = attempts
        self.fromCache = fromCache
    }

    /// What a history form keeps (`NetworkJob.result`): these parts, except
    /// for a large body, whose copy made for `fq_result_body` must not stay
    /// in the history with it — a kept 16 MB
    /// response cost 31 MB once its callback had read the body (a soak
    /// review). The form gets parts of its own that share the body's array;
    /// a dependent that reads the body makes its own copy.
    func forHistory() -> HTTPDetails {
        largeBody.isEmpty ? self : HTTPDetails(sharingLargeBodyOf: self)
    }

    private init(sharingLargeBodyOf other: HTTPDetails) {
        headerList = other.headerList
        storage = nil
        largeBody = other.largeBody
        // The marshal data is the result's to free: the form gets a copy.
        if let data = other.marshal, let copy = malloc(max(data.count, 1)) {
            if let base = data.baseAddress { memcpy(copy, base, data.count) }
            marshal = UnsafeMutableBufferPointer(start: copy.assumingMemoryBound(to: UInt8.self), count: data.count)
        } else {
            marshal = nil
        }
        transfer = other.transfer
        queueWaitMs = other.queueWaitMs
        attempts = other.attempts
        fromCache = other.fromCache
    }

    deinit {
        JSONRef.releasePublished(builtHeaders)
        JSONRef.releasePublished(builtMetrics)
        storage?.deallocate()
        free(marshal?.baseAddress)
        UnsafeMutableRawPointer(bitPattern: builtBody.load(ordering: .acquiring))?.deallocate()
    }

    /// The body (a copy of a small one).
    var body: [UInt8] { storage.map { Array($0) } ?? largeBody }

    /// Calls `body` with the body's bytes, wherever they are kept.
    private func withBody<T>(_ body: (UnsafeRawBufferPointer) -> T) -> T {
        if let storage { return body(UnsafeRawBufferPointer(storage)) }
        return largeBody.withUnsafeBytes(body)
    }

    /// The body at an address that never moves (see the type's comment); nil
    /// when empty.
    var bodyBytes: UnsafeBufferPointer<UInt8>? {
        if let storage { return UnsafeBufferPointer(storage) }
        guard !largeBody.isEmpty else { return nil }
        let count = largeBody.count
        if let p = UnsafeMutableRawPointer(bitPattern: builtBody.load(ordering: .acquiring)) {
            return UnsafeBufferPointer(start: p.assumingMemoryBound(to: UInt8.self), count: count)
        }
        let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: count)
        _ = copy.initialize(from: largeBody)
        let (won, current) = builtBody.compareExchange(
            expected: 0, desired: UInt(bitPattern: copy.baseAddress), ordering: .acquiringAndReleasing)
        if won { return UnsafeBufferPointer(copy) }
        copy.deallocate()
        let winner = UnsafeMutableRawPointer(bitPattern: current)!.assumingMemoryBound(to: UInt8.self)
        return UnsafeBufferPointer(start: winner, count: count)
    }

    var headers: JSONRef? {
        guard let headerList else { return nil }
        return JSONRef.published(in: builtHeaders) { NetworkJob.headers(headerList) }
    }

    var metrics: JSONRef? {
        JSONRef.published(in: builtMetrics) {
            let m = NetworkJob.metrics(transfer, queueWaitMs: queueWaitMs, attempts: attempts)
            m.set("from_cache", JSONRef.bool(fromCache))
            return m
        }
    }

    /// The body parsed, a new value on every call. The body was checked at
    /// the end of the transfer, so this only fails if jansson ran out of
    /// memory. Not kept here: these parts are shared by a result and its
    /// history form, and a document kept by the history went cold before it
    /// was freed (bench/findings.md, "Twentieth round").
    func parsedBody(maxDepth: Int) -> JSONRef? {
        withBody { try? JSONParser.parse($0, maxDepth: maxDepth) }
    }
}

extension NetworkJob {
    /// Whether `body` is one JSON value that `JSONParser.parse` accepts at
    /// `maxDepth` (`JSONParser.isValid`), checked by the walk that also
    /// writes it in marshal's format into `out` (left nil when it is not
    /// valid, or valid but cannot be written that way: see fq_json.h).
    static func isValidMarshalling(_ body: [UInt8], maxDepth: Int,
                                   into out: inout UnsafeMutableBufferPointer<UInt8>?) -> Bool {
        var data: UnsafeMutablePointer<UInt8>? = nil
        var count = 0
        let valid = body.withUnsafeBufferPointer { fqs_json_marshal($0.baseAddress, $0.count, maxDepth, &data, &count) } == 1
        if let data { out = UnsafeMutableBufferPointer(start: data, count: count) }
        return valid
    }

    /// Turns the transport's outcome into the operation's result. Runs on
    /// the transfer thread that received a small response, else on a worker
    /// (see Engine.endsOnLoop). `historyForm`: whether a succeeded result
    /// with a value also gets its history form (false when the history keeps
    /// no network values, or the result is not an operation's own).
    func result(id: OpID, _ outcome: Result<HTTPResponse, TransportError>, queueWaitMs: Double,
                attempts: Int, cancelled: Bool, fromCache: Bool = false,
                historyForm makesForm: Bool) -> OperationResult {
        switch outcome {
        case .failure(let error):
            let info = HTTPInfo(queueWaitMs: queueWaitMs, attempts: attempts, measured: error.metrics)
            if cancelled || error.kind == .cancelled {
                return OperationResult(id: id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(id) was cancelled", value: nil, http: info)
            }
            return OperationResult(id: id, outcome: .failed, status: Self.status(of: error.kind),
                                   message: "\(request.method) \(URLUtilities.redactingPassword(request.url)): \(error.message)", value: nil, http: info)
        case .success(let response):
            if cancelled {
                return OperationResult(id: id, outcome: .cancelled, status: .cancelled,
                                       message: "operation \(id) was cancelled", value: nil,
                                       http: HTTPInfo(response, queueWaitMs: queueWaitMs, attempts: attempts,
                                                      fromCache: fromCache))
            }
            let accepted = accepts(response.status)
            var value: JSONRef? = nil
            var parseError: String? = nil
            var lazyDepth: Int? = nil
            var marshalled: UnsafeMutableBufferPointer<UInt8>? = nil
            var parseStatus = FQStatus.parse
            if shouldParse(response) {
                // "lazy_parse" and "marshal" apply to requests only. With
                // "marshal", the one walk that checks the body also writes
                // it in marshal's format.
                let lazy = lazyParse && search == nil
                let checked = marshal && search == nil
                    ? Self.isValidMarshalling(response.body, maxDepth: maxJSONDepth, into: &marshalled)
                    : lazy && JSONParser.isValid(response.body, maxDepth: maxJSONDepth)
                if lazy && checked {
                    // Checked, not built: the value is parsed when first read.
                    lazyDepth = maxJSONDepth
                } else {
                    // (Also when the check said no: jansson's parse gives the message.)
                    do {
                        value = try JSONParser.parse(response.body, maxDepth: maxJSONDepth)
                    } catch {
                        let what: String
                        var invalid = false
                        switch error.kind {
                        case .depth: what = "the response is nested too deeply"
                        // Valid JSON (RFC 8259 has no number limits), not jansson's.
                        case .unsupported: what = "the response is JSON that jansson cannot hold"
                        case .outOfMemory:
                            what = "out of memory parsing the response (\(response.body.count) bytes)"
                            parseStatus = .noMemory
                        default:
                            what = "the response is not valid JSON"
                            invalid = true
                        }
                        // jansson's message would quote the invisible U+FEFF.
                        let detail = invalid && response.body.starts(with: [0xEF, 0xBB, 0xBF])
                            ? ": it starts with a UTF-8 byte order mark, which JSON does not allow (RFC 8259 §8.1)"
                            : ": \(error)"
                        parseError = "\(request.method) \(URLUtilities.redactingPassword(request.url)): \(what)\(detail)"
                    }
                }
            }
            var info = HTTPInfo(response, queueWaitMs: queueWaitMs, attempts: attempts, fromCache: fromCache,
                                marshal: parseError == nil ? marshalled : nil)
            if parseError != nil { free(marshalled?.baseAddress) }
            info.lazyValueDepth = lazyDepth
            guard accepted else {
                return OperationResult(id: id, outcome: .failed, status: .http,
                                       message: "\(request.method) \(URLUtilities.redactingPassword(request.url)): HTTP status \(response.status)",
                                       value: value, http: info)
            }
            if let parseError {
                return OperationResult(id: id, outcome: .failed, status: parseStatus, message: parseError, value: nil,
                                       http: info)
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
                        // One item per id, the first as sorted (the one a
                        // search-all keeps): in order, a later one overwrote
                        // it (the ninth review). The others count as skipped.
                        // (`items` is the array this value was made with)
                        let first = (try? JSONSearch.dedupe([items], idPointer: search.id)) ?? items
                        var report = try target.store.upsert(collection: target.collection, items: first,
                                                             idPointer: search.id, merge: target.merge)
                        report.skipped += json_array_size(items.pointer) - json_array_size(first.pointer)
                        value?.set("store", report.json())
                    } catch {
                        // Items the store cannot take (not objects) are a
                        // store failure here, not a bad argument of the caller.
                        return OperationResult(id: id, outcome: .failed, status: error.status == .invalid ? .store : error.status,
                                               message: "search \"\(search.query)\": storing into \(target.store.path): \(error.message)",
                                               value: value, http: info)
                    }
                }
            }
            // What the history keeps in this result's place for a dependent
            // submitted later (see `OperationResult.historyForm`). Not for a
            // search with "store": its value says what storing did.
            // A large body without a value gets one too: the result itself
            // would keep the body's copy for fq_result_body.
            var form: OperationResult? = nil
            let parsed = value != nil || lazyDepth != nil
            let details = info.details.forHistory()
            if makesForm, parsed || details !== info.details, search?.store == nil {
                var kept = info
                kept.details = details
                kept.lazyValueDepth = parsed ? maxJSONDepth : nil
                form = OperationResult(historyFormOf: id, http: kept, search: search)
            }
            return OperationResult(id: id, outcome: .succeeded, status: .ok, message: nil, value: value, http: info,
                                   historyForm: form)
        }
    }

    private func shouldParse(_ response: HTTPResponse) -> Bool {
        switch parse {
        case .none: return false
        case .json: return true
        case .auto:
            guard !response.body.isEmpty, let type = response.header("content-type")?.lowercased() else { return false }
            let mime = type.split(separator: ";").first.map { String($0).trimmingCharacters(in: " \t") } ?? ""
            return mime == "application/json" || mime == "text/json" || mime == "application/x-json"
                || (mime.hasPrefix("application/") && mime.hasSuffix("+json"))
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
    /// A name's repeated values are joined once they are all known:
    /// joining as each came copied the whole joined string each time.
    static func headers(_ list: [(name: String, value: String)]) -> JSONRef {
        let object = JSONRef.object()
        var repeated: [ExactString: [String]] = [:]  // by bytes, as the object's keys
        for (name, value) in list {
            let key = name.lowercased()
            if repeated[ExactString(key)] != nil {
                repeated[ExactString(key)]!.append(value)
            } else if key.withCString({ json_object_get(object.pointer, $0) }) != nil {
                repeated[ExactString(key)] = [value]
            } else {
                key.withCString { k in value.withCString { _ = json_object_set_new(object.pointer, k, json_string($0)) } }
            }
        }
        for (key, more) in repeated {
            key.value.withCString { k in
                let joined = ([jsonString(json_object_get(object.pointer, k))] + more).joined(separator: ", ")
                joined.withCString { _ = json_object_set_new(object.pointer, k, json_string($0)) }
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
