import CJansson
import Glibc
import Synchronization

/// How an operation ended, as handed to its completion callback.
/// Immutable; `@unchecked Sendable` because its C string is owned and
/// never written after init.
public final class OperationResult: @unchecked Sendable {
    public let id: OpID
    public let outcome: Outcome
    /// `.ok` on success, else why it failed or was cancelled.
    public let status: FQStatus
    /// Why it failed or was cancelled; nil on success. Formatted on first
    /// use (a cancel-all ends many operations whose messages nobody reads).
    private let reason: EndReason?
    public var message: String? { reason?.message(for: id) }
    /// The operation's value (nil if none). A result whose value is made
    /// from its body (`http.lazyValueDepth`: a request with "lazy_parse",
    /// or a history form) parses it here on first read, for itself alone.
    public var value: JSONRef? { storedValue ?? builtValue }
    /// Whether `value` is non-nil, without parsing a lazy value.
    public var hasValue: Bool { storedValue != nil || http?.lazyValueDepth != nil }
    private let storedValue: JSONRef?
    /// 0, or the bit pattern of an `Unmanaged<JSONRef>`: the value made from
    /// the body, published by the first reader (`JSONRef.published`).
    private let built = Atomic<UInt>(0)
    /// A history form of a search: its value is the search's value of the
    /// parsed body.
    private let search: SearchRebuild?
    /// What the scheduler's history keeps in this result's place for a
    /// dependent submitted after the operation ended (`history_values`): a
    /// result with the same outcome and response parts that parses the body
    /// again if such a dependent reads the value. nil: the history keeps
    /// this result. So a parsed document is freed when its callback and the
    /// program are done with it, while it is still in the cache, instead of
    /// up to `history_values` network results later, out of the cache by
    /// then (bench/findings.md, "Twentieth round").
    let historyForm: OperationResult?
    /// `message` as a C string, made on first use (see `messageCString`).
    private let cMessage = Atomic<UInt>(0)
    /// Status, headers, body and metrics of network operations; nil otherwise.
    public let http: HTTPInfo?
    /// The response came from the HTTP cache (fresh, or revalidated with a 304).
    public var fromCache: Bool { http?.fromCache ?? false }
    /// The thread (a worker or a transfer thread) that made the value and
    /// the response parts, which frees them (see ReleaseList).
    private let owner: ReleaseList?
    /// Who gets this result and the queue it counts for: set by the engine,
    /// under its lock, when it posts the completion (a result is posted
    /// once), and taken by the thread that runs the callback (the delivery
    /// queue's lock orders the two). Carried here so that a delivery item
    /// is a single reference.
    var callback = Callback.none
    var queue: QueueID = 0
    /// Its place among the engine's completions, in the order they are
    /// posted (and so called back): see `Engine.wait(for:timeoutMs:)`.
    var completionSeq: UInt64 = 0

    /// No value and no response parts: nothing big is freed with it, so
    /// the scheduler may drop it from history under its lock.
    var isLight: Bool { storedValue == nil && http == nil }

    /// The callback, leaving none behind (a result kept in history for
    /// dependents must not keep the callback's closure alive).
    func takeCallback() -> Callback {
        let callback = self.callback
        self.callback = .none
        return callback
    }

    init(id: OpID, outcome: Outcome, status: FQStatus, message: String?, value: JSONRef?, http: HTTPInfo? = nil,
         historyForm: OperationResult? = nil) {
        self.id = id
        self.http = http
        self.outcome = outcome
        self.status = status
        self.reason = message.map { .text($0) }
        self.storedValue = value
        self.owner = value == nil && http == nil ? nil : ReleaseList.current
        self.search = nil
        self.historyForm = historyForm
    }

    /// The history form of a succeeded network result (see `historyForm`):
    /// `http.lazyValueDepth` set; `search` for a search's result.
    init(historyFormOf id: OpID, http: HTTPInfo, search: SearchJob?) {
        self.id = id
        self.http = http
        self.outcome = .succeeded
        self.status = .ok
        self.reason = nil
        self.storedValue = nil
        self.owner = ReleaseList.current
        self.search = search.map(SearchRebuild.init)
        self.historyForm = nil
    }

    /// An operation the scheduler ended before it started.
    init(id: OpID, outcome: Outcome, status: FQStatus, reason: EndReason) {
        self.id = id
        self.http = nil
        self.outcome = outcome
        self.status = status
        self.reason = reason
        self.storedValue = nil
        self.owner = nil
        self.search = nil
        self.historyForm = nil
    }

    private var builtValue: JSONRef? {
        guard let http, http.lazyValueDepth != nil else { return nil }
        return JSONRef.published(in: built) {
            guard let document = http.parsedBody else { return nil }
            guard let search else { return document }
            return try? search.job.value(from: document)
        }
    }

    /// `message` as a C string for the C ABI, valid as long as the result.
    /// Made once; callers on several threads (dependents reading a
    /// dependency's result) race to install it and the loser frees its copy.
    public var messageCString: UnsafeMutablePointer<CChar>? {
        let current = cMessage.load(ordering: .acquiring)
        if current != 0 { return UnsafeMutablePointer(bitPattern: current) }
        guard let message, let copy = strdup(FetchQError.cText(message)) else { return nil }
        let bits = UInt(bitPattern: copy)
        let (won, installed) = cMessage.compareExchange(expected: 0, desired: bits, ordering: .acquiringAndReleasing)
        if won { return copy }
        free(copy)
        return UnsafeMutablePointer(bitPattern: installed)
    }

    /// The response body at a stable address for the C ABI (fq_result_body),
    /// copied on first use (most callers never ask).
    public var bodyBytes: UnsafeBufferPointer<UInt8>? { http?.bodyBytes }
    /// Option "marshal": the parsed body in CPython's marshal format.
    public var marshalBytes: UnsafeBufferPointer<UInt8>? { http?.marshalBytes }

    deinit {
        free(UnsafeMutablePointer<CChar>(bitPattern: cMessage.load(ordering: .acquiring)))
        JSONRef.releasePublished(built)
        if let owner, owner !== ReleaseList.current {
            if let storedValue { _ = owner.take(storedValue) }
            if let http { _ = owner.take(http.details) }
        }
    }
}

/// The search a history form's value is made with (boxed: most results
/// are not history forms of searches).
final class SearchRebuild: Sendable {
    let job: SearchJob
    init(_ job: SearchJob) { self.job = job }
}

/// Something that happened to a running operation before it ended,
/// delivered to the engine's event handler ahead of its completion.
///
/// `@unchecked Sendable`: immutable; the C string is owned.
public final class OperationEvent: @unchecked Sendable {
    public enum Kind: Int32, Sendable {
        /// Bytes received so far / expected.
        case progress = 1
        /// A search-all child ended: `child` and `query` say which and how.
        case child = 2
        /// stale-while-revalidate: `child` is the cached result, delivered
        /// before the network answer.
        case update = 3
    }
    public let id: OpID
    public let kind: Kind
    public let received: UInt64
    public let expected: UInt64
    public let child: OperationResult?
    public let query: String?
    public let queryCString: UnsafeMutablePointer<CChar>?

    init(id: OpID, kind: Kind, received: UInt64 = 0, expected: UInt64 = 0,
         child: OperationResult? = nil, query: String? = nil) {
        self.id = id
        self.kind = kind
        self.received = received
        self.expected = expected
        self.child = child
        self.query = query
        queryCString = query.map { strdup($0) }
    }

    deinit { free(queryCString) }
}

public typealias EventHandler = @Sendable (OperationEvent) -> Void
