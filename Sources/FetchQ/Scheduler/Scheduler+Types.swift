/// Operation ids: > 0, never reused by an engine.
public typealias OpID = Int64
/// Queue ids inside one engine.
public typealias QueueID = Int

/// How an operation ended.
public enum Outcome: Int32, Sendable {
    case succeeded = 1
    case failed = 2
    case cancelled = 3
}

/// Where an operation stands, as `fq_state` reports it (1:1 with
/// `fq_op_state` in include/fetchq.h).
public enum OperationState: Int32, Sendable, CaseIterable {
    /// Waits for a dependency or a barrier.
    case waiting = 1
    /// Could start: waits for a place (max_concurrent, max_per_host, a rate
    /// limit), its queue's resume, its retry time, or a transfer it shares.
    case ready = 2
    /// Started and not ended.
    case running = 3
    case succeeded = 4
    case failed = 5
    case cancelled = 6
}

/// Status codes, 1:1 with `fq_status` in include/fetchq.h.
public enum FQStatus: Int32, Sendable, CaseIterable {
    case ok = 0
    case invalid = -1
    case notFound = -2
    case state = -3
    case cycle = -4
    case shutdown = -5
    case timeout = -6
    case cancelled = -7
    case dependency = -8
    case operation = -9
    case queueTimeout = -10
    case http = -11
    case network = -12
    case tooLarge = -13
    case parse = -14
    case tls = -15
    case redirect = -16
    case noMemory = -17
    case store = -18
    case cacheMiss = -19

    public var description: String { staticDescription.description }

    /// The static description `fq_strerror` returns.
    public var staticDescription: StaticString {
        switch self {
        case .ok: "success"
        case .invalid: "invalid argument"
        case .notFound: "no such operation"
        case .state: "not allowed in the current state"
        case .cycle: "dependency cycle"
        case .shutdown: "engine is shutting down"
        case .timeout: "timed out"
        case .cancelled: "cancelled"
        case .dependency: "a dependency failed or was cancelled"
        case .operation: "the operation reported an error"
        case .queueTimeout: "waited in the queue too long"
        case .http: "HTTP status not accepted"
        case .network: "network error"
        case .tooLarge: "response too large"
        case .parse: "invalid JSON"
        case .tls: "TLS error"
        case .redirect: "too many redirects"
        case .noMemory: "out of memory"
        case .store: "item store error"
        case .cacheMiss: "not in the cache"
        }
    }
}

/// An error from the engine's API: a status code and a message
/// (mapped 1:1 to the C status enum).
public struct FetchQError: Error, Sendable, CustomStringConvertible {
    public var status: FQStatus
    public var message: String
    public init(_ status: FQStatus, _ message: String) {
        self.status = status
        self.message = message
    }
    public var description: String { message }

    /// `text` for a C string: a NUL in it (from a caller's string the message
    /// quotes) would end it there, so each is written as the two characters
    /// `\0`.
    public static func cText(_ text: String) -> String {
        guard text.utf8.contains(0) else { return text }
        return text.split(separator: "\u{0}", omittingEmptySubsequences: false).joined(separator: "\\0")
    }
}

/// Priority levels, as in NSOperation.QueuePriority.
public enum Priority: Int, Sendable, CaseIterable {
    case veryLow = -8, low = -4, normal = 0, high = 4, veryHigh = 8

    /// 0 (very low) ... 4 (very high).
    var level: Int { (rawValue + 8) / 4 }

    public var name: String {
        switch self {
        case .veryLow: "very-low"
        case .low: "low"
        case .normal: "normal"
        case .high: "high"
        case .veryHigh: "very-high"
        }
    }

    public init?(name: String) {
        guard let p = Priority.allCases.first(where: { $0.name == name }) else { return nil }
        self = p
    }
}

/// Quality of service, as in NSOperation.qualityOfService.
public enum QoS: Int, Sendable, CaseIterable {
    case background = 0, utility = 1, `default` = 2, userInitiated = 3, userInteractive = 4

    public var name: String {
        switch self {
        case .background: "background"
        case .utility: "utility"
        case .default: "default"
        case .userInitiated: "user-initiated"
        case .userInteractive: "user-interactive"
        }
    }

    public init?(name: String) {
        guard let q = QoS.allCases.first(where: { $0.name == name }) else { return nil }
        self = q
    }
}

/// Why an operation ended without succeeding, as decided by the scheduler or
/// the runtime. The message is formatted only when somebody reads it: a
/// cancel-all of 100 000 queued operations should not format 100 000
/// strings nobody looks at.
public enum EndReason: Sendable, Equatable {
    /// Cancelled by a cancel of its own (or of its group, queue, engine).
    case cancelled
    /// A strict dependency failed or was cancelled.
    case dependency(OpID, Outcome)
    case text(String)

    public func message(for id: OpID) -> String {
        switch self {
        case .cancelled: "operation \(id) was cancelled"
        case .dependency(let dep, let outcome): "dependency \(dep) \(outcome == .cancelled ? "was cancelled" : "failed")"
        case .text(let text): text
        }
    }
}
