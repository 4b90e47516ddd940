// The transport's vocabulary: what a request is, what comes back, how it fails.
// Plain values, no curl types, so the scheduler and tests can use a fake.

/// Identifies one `start` on a transport. Never reused within a process.
package struct TransferID: Hashable, Sendable, CustomStringConvertible {
    package let rawValue: UInt64
    package init(rawValue: UInt64) { self.rawValue = rawValue }
    package var description: String { "transfer#\(rawValue)" }
}

package struct HTTPRequest: Sendable {
    /// Any HTTP token (GET, POST, PURGE, ...). Case-sensitive. HEAD is sent with
    /// curl's NOBODY so curl does not wait for a body; HEAD with a body is invalid.
    package var method: String
    package var url: String
    /// Sent in order. A header with an empty value is sent as `Name:` with no value
    /// (curl's `Name;` form). Names must be tokens; values must not contain CR, LF or NUL.
    package var headers: [(name: String, value: String)]
    /// Sent as-is with an explicit Content-Length (binary-safe). nil = no body;
    /// [] = an empty body (`Content-Length: 0`). When there is a body and no
    /// Content-Type header, none is sent (curl's form-urlencoded default is removed).
    package var body: [UInt8]?
    /// 0 = curl's default (300 s).
    package var connectTimeoutMs: Int
    /// Whole transfer, redirects included. 0 = no limit.
    package var timeoutMs: Int
    package var followRedirects: Bool
    /// Followed redirects allowed before `.tooManyRedirects` (only with `followRedirects`).
    package var maxRedirects: Int
    /// Largest accepted body (after content decoding). 0 = no limit.
    /// Exceeding it aborts the transfer at once with `.tooLarge`.
    package var maxResponseBytes: Int
    package var verifyTLS: Bool
    /// A PEM bundle replacing the system CA store; nil = system store.
    package var caFile: String?
    /// nil: the proxy environment variables; "": none; else the proxy's URL.
    package var proxy: String? = nil
    package var userAgent: String
    /// true: send `Accept-Encoding` with every coding curl supports (gzip, deflate,
    /// br, zstd in this build) and decode the body. Decoding errors -> `.badContentEncoding`.
    package var acceptEncoding: Bool
    /// Minimum interval between two progress calls for one transfer. 0 = every change.
    package var progressIntervalMs: Int

    package init(
        method: String = "GET",
        url: String,
        headers: [(name: String, value: String)] = [],
        body: [UInt8]? = nil,
        connectTimeoutMs: Int = 0,
        timeoutMs: Int = 0,
        followRedirects: Bool = true,
        maxRedirects: Int = 5,
        maxResponseBytes: Int = 0,
        verifyTLS: Bool = true,
        caFile: String? = nil,
        userAgent: String = "fetchq",
        acceptEncoding: Bool = true,
        progressIntervalMs: Int = 100
    ) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.connectTimeoutMs = connectTimeoutMs
        self.timeoutMs = timeoutMs
        self.followRedirects = followRedirects
        self.maxRedirects = maxRedirects
        self.maxResponseBytes = maxResponseBytes
        self.verifyTLS = verifyTLS
        self.caFile = caFile
        self.userAgent = userAgent
        self.acceptEncoding = acceptEncoding
        self.progressIntervalMs = progressIntervalMs
    }
}

package struct TransferMetrics: Sendable, Equatable {
    /// Times from the start of the transfer, in milliseconds (curl's CONNECT_TIME,
    /// STARTTRANSFER_TIME and TOTAL_TIME; across all redirects).
    package var connectMs: Double = 0
    package var firstByteMs: Double = 0
    package var totalMs: Double = 0
    /// Body bytes delivered (after content decoding).
    package var bytesReceived: Int = 0
    package var redirects: Int = 0
    /// "1.0", "1.1", "2", "3", or "" when no response was received.
    package var httpVersion: String = ""
    /// No new connection was made for this transfer.
    package var reusedConnection: Bool = false

    package init() {}
}

package struct HTTPResponse: Sendable {
    package var status: Int
    /// Headers of the final response only (not of redirects or 100 Continue), in
    /// the order received, names as sent by the server. Trailers, if any, follow.
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]
    package var effectiveURL: String
    package var metrics: TransferMetrics

    /// First header with this name, compared case-insensitively (ASCII).
    package func header(_ name: String) -> String? {
        headers.first { TransportText.equalsIgnoringASCIICase($0.name, name) }?.value
    }
}

package struct TransportError: Error, Sendable, CustomStringConvertible {
    package enum Kind: Sendable, Equatable {
        case cancelled, timeout, connect, resolve, tooLarge, tooManyRedirects, tls
        case badContentEncoding, network, invalidRequest
    }
    package var kind: Kind
    /// What went wrong: curl's error text (its error buffer, else curl_easy_strerror)
    /// with the curl code, and where redirects led; or our own reason. It does
    /// not repeat the request's method and URL (the caller has those).
    package var message: String
    /// The CURLcode, or 0 when curl was not involved (cancelled, rejected before start).
    package var curlCode: Int
    /// What curl measured before the failure (times, bytes, redirects), when
    /// curl ran the transfer; nil otherwise.
    package var metrics: TransferMetrics? = nil

    package init(kind: Kind, message: String, curlCode: Int = 0) {
        self.kind = kind
        self.message = message
        self.curlCode = curlCode
    }

    package var description: String { "\(kind): \(message)" }
}

/// What the scheduler needs from a transport; CurlTransport is the real one.
package protocol HTTPTransport: AnyObject, Sendable {
    func start(
        _ request: HTTPRequest,
        progress: (@Sendable (_ received: UInt64, _ expected: UInt64) -> Void)?,
        completion: @escaping @Sendable (Result<HTTPResponse, TransportError>) -> Void
    ) -> TransferID
    func cancel(_ id: TransferID)
    func shutdown()
    var activeTransfers: Int { get }
}

enum TransportText {
    static func equalsIgnoringASCIICase(_ a: String, _ b: String) -> Bool {
        a.utf8.count == b.utf8.count && hasPrefixIgnoringASCIICase(a, b)
    }

    /// Whether `text` starts with `prefix`, ASCII letters compared without
    /// case, on the UTF-8 bytes.
    static func hasPrefixIgnoringASCIICase(_ text: String, _ prefix: String) -> Bool {
        let x = text.utf8, y = prefix.utf8
        guard x.count >= y.count else { return false }
        for (p, q) in zip(x, y) where p != q {
            let lp = (p >= 65 && p <= 90) ? p + 32 : p
            let lq = (q >= 65 && q <= 90) ? q + 32 : q
            if lp != lq { return false }
        }
        return true
    }
}
