import CCurl
import CFetchQSupport
import Glibc

/// One transfer: the request, the callbacks, and the response under construction.
///
/// @unchecked Sendable: created, used and released on the loop thread only —
/// by the loop itself and by the curl callbacks that curl_multi_perform runs
/// there (callers hand over a `CurlStart`). No field is ever accessed from two
/// threads.
final class CurlTransfer: @unchecked Sendable {
    typealias Progress = @Sendable (_ received: UInt64, _ expected: UInt64) -> Void
    typealias Completion = @Sendable (Result<HTTPResponse, TransportError>) -> Void

    let id: TransferID
    /// What is sent; the next hop's request once this transfer follows a
    /// redirect itself (`nextHop`).
    private(set) var request: HTTPRequest
    let progress: Progress?
    let completion: Completion
    /// Set when `start` refused the request; delivered from the loop thread.
    let rejection: TransportError?

    /// The easy handle while the transfer owns one.
    var easy: UnsafeMutableRawPointer?
    var completed = false

    // Memory curl points into while the handle is configured for this transfer.
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private var postData: UnsafeMutableRawPointer?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    /// errno of a socket() that failed in this hop (0: none), written by the
    /// OPENSOCKETFUNCTION.
    private let socketErrno: UnsafeMutablePointer<Int32>

    // The response under construction.
    private var headers: [(name: String, value: String)] = []
    private var body: [UInt8] = []
    private var reserved = false
    private var capExceeded = false
    /// The blank line after the current response's header section came: a
    /// field line now is a trailer (until the next status line).
    private var headerSectionEnded = false
    /// The last field line was dropped (its obs-fold continuation goes too).
    private var droppedLastLine = false
    /// The response's Content-Length as first given (-1: none yet).
    private var declaredLength: Int64 = -1
    /// Why the header callback stopped the transfer (bad framing), if it did.
    private var framingError: String?
    private var lastProgressNs: UInt64 = 0
    // curl's own re-send of a request (see `beforeRequest`).
    /// Requests made so far in this hop (curl's PREREQFUNCTION calls).
    private var requestsMade = 0
    /// A status line came since the last request was made.
    private var answeredSinceRequest = false
    /// Whether the connection the last request went out on carried HTTP/2
    /// (1), HTTP/1.x (0), or is unknown (-1).
    private var lastConnectionMultiplexed: Int32 = -1
    /// The prereq callback stopped curl from sending a request again.
    private var refusedResend = false
    private var lastProgressReceived: UInt64?
    /// The current response is a redirect that will be followed (its
    /// status says so, and it has a Location): its body is not the
    /// response's, so it is not reported as progress.
    private var bodyIsARedirects = false
    /// The current response's status is one a redirect is followed on.
    private var statusRedirects = false
    /// The current response is a 304.
    private var statusIs304 = false
    /// The header callback stopped the transfer at the end of a 304 with a
    /// Location that libcurl would have followed: the 304 is the response.
    private(set) var stoppedAt304 = false
    /// A redirect this transfer follows itself had a body over the cap,
    /// which was read and dropped: an error if that 3xx becomes the result.
    private var redirectBodyOverCap = false

    // Redirects this transfer follows itself (`followsItself`).
    private var hops = 0
    /// Sent again on a new connection after a 408 on a reused one (`nextHop`).
    private var resentAfter408 = false
    /// The milliseconds the hops before the current one took.
    private var earlierHopsMs: Double = 0
    /// When the first hop was configured (CLOCK_MONOTONIC), for `timeoutMs`
    /// across hops.
    private var firstHopNs: UInt64 = 0

    init(
        id: TransferID, request: HTTPRequest, progress: Progress?, completion: @escaping Completion,
        rejection: TransportError?
    ) {
        self.id = id
        self.request = request
        self.progress = progress
        self.completion = completion
        self.rejection = rejection
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE))
        socketErrno = .allocate(capacity: 1)
        socketErrno.initialize(to: 0)
    }

    deinit {
        releaseCurlMemory()
        errorBuffer.deallocate()
        socketErrno.deallocate()
    }

    /// Frees what curl pointed into. Only after the handle left the multi handle
    /// (or was never added) and before or after curl_easy_reset.
    func releaseCurlMemory() {
        if let list = headerList { curl_slist_free_all(list) }
        headerList = nil
        postData?.deallocate()
        postData = nil
    }

    // MARK: - Validation (any thread, pure)

    /// Why curl must not see this request, or nil. Checks what curl would send
    /// verbatim (method, header lines) so nothing can inject extra lines.
    static func validate(_ request: HTTPRequest) -> String? {
        if request.method.isEmpty || !request.method.utf8.allSatisfy(isTokenByte) {
            return "method '\(request.method)' is not an HTTP token"
        }
        if !hasScheme(request.url, "http://") && !hasScheme(request.url, "https://") {
            return "URL must start with http:// or https://"
        }
        if request.url.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) {
            return "URL contains spaces or control characters"
        }
        for (name, value) in request.headers {
            if name.isEmpty || !name.utf8.allSatisfy(isTokenByte) {
                return "header name '\(name)' is not an HTTP token"
            }
            if value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) {
                return "header '\(name)' has CR, LF or NUL in its value"
            }
        }
        if request.method == "HEAD" && request.body != nil { return "HEAD request with a body" }
        if request.connectTimeoutMs < 0 || request.timeoutMs < 0 { return "negative timeout" }
        if request.maxRedirects < 0 { return "negative maxRedirects" }
        if request.maxResponseBytes < 0 { return "negative maxResponseBytes" }
        if request.progressIntervalMs < 0 { return "negative progressIntervalMs" }
        if request.caFile?.utf8.contains(0) == true || request.userAgent.utf8.contains(0) {
            return "NUL in caFile or userAgent"
        }
        return nil
    }

    /// Case-insensitive prefix test for an ASCII scheme ("https://"), on the
    /// UTF-8 bytes (runs three times per transfer; cutting a prefix of
    /// Characters cost ~2 k instructions each time).
    static func hasScheme(_ url: String, _ scheme: String) -> Bool {
        TransportText.hasPrefixIgnoringASCIICase(url, scheme)
    }

    /// RFC 9110 tchar.
    /// (A switch on the byte: every response header's name is checked, and
    /// searching a string of the other characters cost ~100 instructions a byte.)
    @inline(__always)
    private static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case 0x61...0x7A, 0x41...0x5A, 0x30...0x39,  // a-z A-Z 0-9
            0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E:
            return true  // ! # $ % & ' * + - . ^ _ ` | ~
        default:
            return false
        }
    }

    // MARK: - Configuration (loop thread)

    /// Sets every option for this transfer on a fresh (or reset) easy handle.
    /// Returns an error message when curl refuses an option.
    func configure(_ easy: UnsafeMutableRawPointer) -> String? {
        var failure: String?
        func check(_ rc: CURLcode, _ what: String) {
            if rc != CURLE_OK && failure == nil {
                failure = "\(what): \(TransportError.curlText(rc))"
            }
        }
        func long(_ option: CURLoption, _ value: Int, _ what: String) {
            check(fqc_easy_setopt_long(easy, option, value), what)
        }
        func string(_ option: CURLoption, _ value: String, _ what: String) {
            check(value.withCString { fqc_easy_setopt_string(easy, option, $0) }, what)
        }
        let r = request
        let me = Unmanaged.passUnretained(self).toOpaque()

        // Plumbing.
        long(CURLOPT_NOSIGNAL, 1, "NOSIGNAL")
        socketErrno.pointee = 0
        check(fqc_easy_cloexec_sockets(easy, socketErrno), "OPENSOCKETFUNCTION")
        check(fqc_easy_setopt_pointer(easy, CURLOPT_PRIVATE, me), "PRIVATE")
        errorBuffer[0] = 0
        check(fqc_easy_setopt_pointer(easy, CURLOPT_ERRORBUFFER, errorBuffer), "ERRORBUFFER")
        check(fqc_easy_setopt_write_callback(easy, CURLOPT_WRITEFUNCTION, curlWriteBody), "WRITEFUNCTION")
        check(fqc_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, me), "WRITEDATA")
        check(fqc_easy_setopt_write_callback(easy, CURLOPT_HEADERFUNCTION, curlWriteHeader), "HEADERFUNCTION")
        check(fqc_easy_setopt_pointer(easy, CURLOPT_HEADERDATA, me), "HEADERDATA")
        // Always: besides progress events, it bounds the bytes of a body curl
        // reads and discards (a redirect's it follows), which no write
        // callback sees (`exceedsCapUnseen`).
        long(CURLOPT_NOPROGRESS, 0, "NOPROGRESS")
        requestsMade = 0
        answeredSinceRequest = false
        refusedResend = false
        if !RetryPolicy.idempotent.contains(request.method) {
            // libcurl 7.88 sends a request again, whatever its method, when a
            // reused connection closes before any byte of the answer
            // (`Curl_retry_request`): see `beforeRequest`.
            check(fqc_easy_setopt_prereq_callback(easy, curlBeforeRequest), "PREREQFUNCTION")
            check(fqc_easy_setopt_pointer(easy, CURLOPT_PREREQDATA, me), "PREREQDATA")
        }
        check(fqc_easy_setopt_xferinfo_callback(easy, CURLOPT_XFERINFOFUNCTION, curlProgress), "XFERINFOFUNCTION")
        check(fqc_easy_setopt_pointer(easy, CURLOPT_XFERINFODATA, me), "XFERINFODATA")

        // Where and how.
        string(CURLOPT_URL, r.url, "URL")
        string(CURLOPT_PROTOCOLS_STR, "http,https", "PROTOCOLS_STR")
        string(CURLOPT_REDIR_PROTOCOLS_STR, "http,https", "REDIR_PROTOCOLS_STR")
        // A body over HTTP/2's initial stream window goes over HTTP/1.1:
        // libcurl 7.88 waits for window to send the rest of a body even
        // after the server answered without reading it (nginx's 200 to an
        // upload it ignores), until timeout_ms, and the answer is lost.
        // Its connection is not kept: libcurl would give it to the next
        // requests to the host, over HTTP/1.1 too.
        let windowBytes = 65_535
        if (r.body?.count ?? 0) > windowBytes {
            long(CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1, "HTTP_VERSION")
            long(CURLOPT_FORBID_REUSE, 1, "FORBID_REUSE")
        } else {
            long(CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS, "HTTP_VERSION")
        }
        // Over TLS, wait for a connection being set up to the same host (ALPN tells
        // within the handshake whether it multiplexes) rather than opening another.
        // Not for cleartext: HTTP/1.1 is only known once a response arrives, so a
        // stalled first request would hold back every other one to that host.
        if Self.hasScheme(r.url, "https://") { long(CURLOPT_PIPEWAIT, 1, "PIPEWAIT") }
        long(CURLOPT_TCP_KEEPALIVE, 1, "TCP_KEEPALIVE")
        // A proxy's answer to CONNECT is not the response (and must not count
        // as an answer to the request for `beforeRequest`).
        long(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1, "SUPPRESS_CONNECT_HEADERS")
        if resentAfter408 { long(CURLOPT_FRESH_CONNECT, 1, "FRESH_CONNECT") }
        if r.connectTimeoutMs > 0 { long(CURLOPT_CONNECTTIMEOUT_MS, r.connectTimeoutMs, "CONNECTTIMEOUT_MS") }
        let firstRequest = hops == 0 && !resentAfter408
        if firstRequest { firstHopNs = Self.monotonicNs() }
        if r.timeoutMs > 0 {
            // After a hop followed here: what is left of it (nextHop checked some is).
            long(CURLOPT_TIMEOUT_MS, firstRequest ? r.timeoutMs : max(1, r.timeoutMs - spentMs()), "TIMEOUT_MS")
        }
        // Redirects. CURLOPT_UNRESTRICTED_AUTH stays 0 (curl's default): curl then
        // drops custom Authorization and Cookie headers when a redirect changes
        // host, port or scheme.
        long(CURLOPT_FOLLOWLOCATION, r.followRedirects && !followsItself ? 1 : 0, "FOLLOWLOCATION")
        long(CURLOPT_MAXREDIRS, r.maxRedirects - hops, "MAXREDIRS")
        // Size cap: the write callback refuses a body whose Content-Length is
        // over it at its first bytes, and stops any other at the cap. Not
        // CURLOPT_MAXFILESIZE: curl applies it to every response's
        // Content-Length, a HEAD's and a followed redirect's too, whose
        // bodies are never read.
        // TLS.
        long(CURLOPT_SSL_VERIFYPEER, r.verifyTLS ? 1 : 0, "SSL_VERIFYPEER")
        long(CURLOPT_SSL_VERIFYHOST, r.verifyTLS ? 2 : 0, "SSL_VERIFYHOST")
        if let ca = r.caFile { string(CURLOPT_CAINFO, ca, "CAINFO") }
        // "" turns proxies off, the environment's included.
        if let proxy = r.proxy { string(CURLOPT_PROXY, proxy, "PROXY") }
        string(CURLOPT_USERAGENT, r.userAgent, "USERAGENT")
        if r.acceptEncoding { string(CURLOPT_ACCEPT_ENCODING, "", "ACCEPT_ENCODING") }

        // Method and body.
        var sendsBody = false
        switch r.method {
        case "HEAD":
            long(CURLOPT_NOBODY, 1, "NOBODY")
        case "GET" where r.body == nil:
            long(CURLOPT_HTTPGET, 1, "HTTPGET")
        case "POST":
            sendsBody = true
        default:
            string(CURLOPT_CUSTOMREQUEST, r.method, "CUSTOMREQUEST")
            sendsBody = r.body != nil
        }
        if sendsBody {
            let bytes = r.body ?? []
            // POSTFIELDS is not copied: the buffer lives until releaseCurlMemory().
            // At least one byte so the pointer is never NULL (NULL means "use the
            // read callback").
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
            bytes.withUnsafeBytes { src in
                if let base = src.baseAddress { buffer.copyMemory(from: base, byteCount: src.count) }
            }
            postData = buffer
            check(fqc_easy_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(bytes.count)), "POSTFIELDSIZE_LARGE")
            check(fqc_easy_setopt_pointer(easy, CURLOPT_POSTFIELDS, buffer), "POSTFIELDS")
        }

        // Headers. "Name:" would make curl remove the header, so an empty value
        // uses curl's "Name;" form; so does one of only spaces and tabs, which
        // curl read as "Name:" (RFC 9110 §5.5: whitespace around a field
        // value is not part of it).
        // Appended at the tail: curl_slist_append walks the list it is given
        // to its end, so a request with n headers took n²/2 steps.
        var list: UnsafeMutablePointer<curl_slist>?
        var tail: UnsafeMutablePointer<curl_slist>?
        func add(_ line: String) {
            guard let grown = curl_slist_append(tail, line) else {
                failure = failure ?? "out of memory"
                return
            }
            if list == nil { list = grown }
            tail = tail == nil ? grown : tail!.pointee.next
        }
        var hasContentType = false
        var hasExpect = false
        for (name, value) in r.headers {
            if TransportText.equalsIgnoringASCIICase(name, "Content-Type") { hasContentType = true }
            if TransportText.equalsIgnoringASCIICase(name, "Expect") { hasExpect = true }
            add(value.utf8.allSatisfy { $0 == 0x20 || $0 == 0x09 } ? "\(name);" : "\(name): \(value)")
        }
        if sendsBody && !hasContentType { add("Content-Type:") }  // drop curl's form-urlencoded default
        if sendsBody && !hasExpect { add("Expect:") }  // no 100-continue round trip unless asked
        headerList = list
        if let list { check(fqc_easy_setopt_pointer(easy, CURLOPT_HTTPHEADER, list), "HTTPHEADER") }
        return failure
    }

    // MARK: - Callbacks (loop thread, inside curl_multi_perform)

    /// Body bytes (already content-decoded). Returning less than `count` makes
    /// curl stop with CURLE_WRITE_ERROR.
    /// The most a body's buffer reserves up front from its Content-Length.
    static let largestReservation = 16 << 20

    fileprivate func receiveBody(_ data: UnsafeRawPointer, _ count: Int) -> Int {
        let cap = request.maxResponseBytes
        if cap > 0 && body.count + count > cap {
            if bodyIsARedirects && followsItself {
                // A redirect's body is not the response: read on, keep no more.
                redirectBodyOverCap = true
                return count
            }
            capExceeded = true
            return 0
        }
        if !reserved {
            reserved = true
            var length: curl_off_t = -1
            if let easy, fqc_easy_getinfo_off(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK,
                length > 0
            {
                // Content-Length is the size as sent: with a Content-Encoding
                // the decoded body, which the cap counts, may be smaller.
                if cap > 0 && Int64(length) > Int64(cap) && !isContentEncoded && !(bodyIsARedirects && followsItself) {
                    capExceeded = true
                    return 0
                }
                // A hint only (encoded size), bounded by 16 MiB whatever the
                // cap, so a lying Content-Length cannot make us allocate: one
                // of 10^12 under a cap of 2^40 ended the process (the tenth
                // review). A larger body grows the buffer as it arrives.
                body.reserveCapacity(min(Int(length), cap > 0 ? cap : Int.max, Self.largestReservation))
            }
        }
        body.append(contentsOf: UnsafeRawBufferPointer(start: data, count: count))
        return count
    }

    /// One header line, CRLF included: a status line, a field, the blank
    /// line, or a trailer field after a chunked body. Returning less than
    /// `count` makes curl stop with CURLE_WRITE_ERROR (`framingError` says why).
    fileprivate func receiveHeader(_ data: UnsafeRawPointer, _ count: Int) -> Int {
        var line = UnsafeRawBufferPointer(start: data, count: count)[...]
        while let last = line.last, last == 0x0A || last == 0x0D { line = line.dropLast() }
        if line.isEmpty {
            if !headerSectionEnded && statusRedirects && request.followRedirects {
                bodyIsARedirects = headers.contains { TransportText.equalsIgnoringASCIICase($0.name, "location") }
            }
            if !headerSectionEnded && statusIs304 && request.followRedirects && !followsItself
                && headers.contains(where: { TransportText.equalsIgnoringASCIICase($0.name, "location") })
            {
                // libcurl 7.88 follows a Location on any 3xx, a 304 too, which
                // is no redirect (RFC 9110 §15.4.5; fetchq.h): stop here, the
                // 304 (which has no body) is the response.
                headerSectionEnded = true
                stoppedAt304 = true
                return 0
            }
            headerSectionEnded = true
            return count
        }
        if line.starts(with: "HTTP/".utf8) {
            answeredSinceRequest = true
            let status = Self.statusCode(line)
            if status == 101 {
                // fetchq never asks for an upgrade (RFC 9110 §15.2.2: a server
                // sends 101 only to a request that did); curl would wait on
                // the connection for a response that never comes.
                framingError = "the server switched protocols (101): fetchq speaks only HTTP"
                return 0
            }
            // A new response (after a redirect, a 1xx, a proxy CONNECT): only the
            // final one's headers and body count.
            headers.removeAll(keepingCapacity: true)
            body.removeAll(keepingCapacity: true)
            reserved = false
            headerSectionEnded = false
            declaredLength = -1
            // Progress counts this response's body from 0 (curl's counts
            // start again with each request).
            lastProgressReceived = nil
            statusRedirects = status.map(Self.followsStatus) ?? false
            statusIs304 = status == 304
            bodyIsARedirects = false
            return count
        }
        // RFC 9110 §6.5.1: trailer fields are not merged into the header
        // section (a trailer could otherwise make a response cacheable or
        // change how it is parsed). They are dropped.
        if headerSectionEnded { return count }
        if line.first == 0x20 || line.first == 0x09 {
            // obs-fold continuation of the previous field (dropped with it).
            if !headers.isEmpty && !droppedLastLine {
                headers[headers.count - 1].value += " " + Self.fieldValue(line)
            }
            return count
        }
        droppedLastLine = true
        guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { return count }
        // RFC 9110 §5.1, RFC 9112 §5.1: a field name is a token, with no
        // whitespace before the colon; a line that breaks this is dropped.
        let nameBytes = line[..<colon]
        guard !nameBytes.isEmpty, nameBytes.allSatisfy(Self.isTokenByte) else { return count }
        droppedLastLine = false
        let valueBytes = line[(colon + 1)...]
        if nameBytes.count == 14 && Self.isContentLength(nameBytes) && !acceptsContentLength(valueBytes) {
            return 0
        }
        let name = String(decoding: nameBytes, as: UTF8.self)
        let value = Self.fieldValue(valueBytes)
        // Room for a typical response's fields at once (growing one by one
        // reallocated the array four times per response).
        if headers.capacity == 0 { headers.reserveCapacity(16) }
        headers.append((name: name, value: value))
        return count
    }

    private static let contentLengthName = Array("content-length".utf8)

    /// "content-length" in any case (14 bytes; an indexed loop: zipping with
    /// a string's UTF-8 view cost ~1 k instructions a response).
    private static func isContentLength(_ name: Slice<UnsafeRawBufferPointer>) -> Bool {
        var i = name.startIndex
        for expected in contentLengthName {
            guard name[i] | 0x20 == expected else { return false }
            i += 1
        }
        return true
    }

    /// RFC 9112 §6.3: a Content-Length that is not digits, or differs from
    /// one given before (a list must repeat one value), is an unrecoverable
    /// framing error: the response is not used. libcurl 7.88 read such a
    /// value's leading digits ("0x12" as 0, "2, 18" as 2) and framed the
    /// body by them.
    private func acceptsContentLength(_ value: Slice<UnsafeRawBufferPointer>) -> Bool {
        // `digits` counts significant digits (leading zeros are allowed);
        // RFC 9110 §5.6.1: empty list elements are ignored.
        var n: Int64 = 0, digits = 0, seen = false, spaceAfter = false, any = false
        func itemEnded() -> Bool {
            guard seen else { return true }  // an empty element
            any = true
            if declaredLength >= 0 && n != declaredLength {
                framingError = "the response gives two Content-Lengths (\(declaredLength) and \(n))"
                return false
            }
            declaredLength = n
            n = 0
            digits = 0
            seen = false
            return true
        }
        for b in value {
            switch b {
            case 0x30...0x39 where !spaceAfter && digits < 18:
                seen = true
                if n > 0 || b != 0x30 { digits += 1 }
                n = n * 10 + Int64(b - 0x30)
            case 0x20, 0x09:
                if digits > 0 { spaceAfter = true }
            case UInt8(ascii: ","):
                guard itemEnded() else { return framingErrorSet(value) }
                spaceAfter = false
            default:
                return framingErrorSet(value)
            }
        }
        return itemEnded() && any || framingErrorSet(value)
    }

    /// Sets `framingError` for an invalid Content-Length (unless a conflict set it); false.
    private func framingErrorSet(_ value: Slice<UnsafeRawBufferPointer>) -> Bool {
        if framingError == nil {
            framingError = "the response's Content-Length \"\(Self.fieldValue(value))\" is not a length"
        }
        return false
    }

    /// Whether the bytes curl reports for the current response are past
    /// what the cap allows, when the write callback does not see them (the
    /// body of a redirect curl follows is read and discarded). The count is
    /// of the bytes as sent: room is left for a content-coding's own bytes.
    private func exceedsCapUnseen(_ received: curl_off_t) -> Bool {
        let cap = request.maxResponseBytes
        guard cap > 0 else { return false }
        return Int64(received) > Int64(cap) + Int64(cap / 64) + 65_536
    }

    /// Whether the response being received names a Content-Encoding other
    /// than identity (its body is decoded on the way to the write callback).
    private var isContentEncoded: Bool {
        headers.contains {
            TransportText.equalsIgnoringASCIICase($0.name, "content-encoding")
                && !TransportText.equalsIgnoringASCIICase($0.value, "identity") && !$0.value.isEmpty
        }
    }

    /// Whether a status line's code is 101.
    /// The three-digit code of a status line, nil if it has none.
    private static func statusCode(_ line: Slice<UnsafeRawBufferPointer>) -> Int? {
        guard let space = line.firstIndex(of: 0x20) else { return nil }
        let code = line[(space + 1)...].prefix(4)
        guard code.count == 3 || code.last == 0x20 else { return nil }
        var value = 0
        for digit in code.prefix(3) {
            guard digit >= UInt8(ascii: "0") && digit <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(digit - UInt8(ascii: "0"))
        }
        return value
    }

    /// A status a redirect is followed on (with a Location): a 3xx other
    /// than 304, by libcurl and by `nextHop` alike.
    static func followsStatus(_ status: Int) -> Bool { (300..<400).contains(status) && status != 304 }

    /// A field value: surrounding whitespace trimmed, a bare CR written as
    /// a space (RFC 9110 §5.5).
    private static func fieldValue(_ bytes: Slice<UnsafeRawBufferPointer>) -> String {
        var s = bytes
        while let f = s.first, f == 0x20 || f == 0x09 { s = s.dropFirst() }
        while let l = s.last, l == 0x20 || l == 0x09 { s = s.dropLast() }
        let raw = UnsafeRawBufferPointer(rebasing: s)
        guard !raw.isEmpty, memchr(raw.baseAddress!, 0x0D, raw.count) != nil else {
            return String(decoding: raw, as: UTF8.self)
        }
        return String(decoding: s.map { $0 == 0x0D ? 0x20 : $0 }, as: UTF8.self)
    }

    /// curl's PREREQFUNCTION, for a method that is not idempotent: false
    /// stops the transfer. A second request in one hop with no answer to the
    /// first is curl sending it again because the reused connection closed
    /// before answering; the server may have read it and acted on it, so it is
    /// not sent again (RFC 9112 §9.3.1.1) — fetchq's retry policy decides
    /// ("retry": {"any_method": true}). Over HTTP/2 curl sends again only a
    /// request the server refused unprocessed (REFUSED_STREAM, a GOAWAY's
    /// later streams), as RFC 9113 §8.7 allows, and that is let through. A
    /// redirect or an authentication round is a second request after an
    /// answer.
    fileprivate func beforeRequest() -> Bool {
        if requestsMade > 0 && !answeredSinceRequest && lastConnectionMultiplexed != 1 {
            refusedResend = true
            return false
        }
        requestsMade += 1
        answeredSinceRequest = false
        if let easy { lastConnectionMultiplexed = fqc_connection_multiplexed(easy) }
        return true
    }

    /// The xferinfo callback: false stops the transfer (the cap).
    fileprivate func transferred(total: curl_off_t, now: curl_off_t) -> Bool {
        if exceedsCapUnseen(now) {
            capExceeded = true
            return false
        }
        if progress != nil { reportProgress(total: total) }
        return true
    }

    /// Progress counts the body as the write callback gets it, decoded, as
    /// the last event (the body's size) does; curl's own count is of the
    /// bytes as sent. Content-Length counts those too, so with a
    /// Content-Encoding the size to expect is not known (0): a gzip body's
    /// events went up to its encoded size and then to its decoded one,
    /// down when it was smaller decoded (the ninth review).
    fileprivate func reportProgress(total: curl_off_t) {
        guard let progress, !body.isEmpty, !bodyIsARedirects else { return }
        let received = UInt64(body.count)
        if let last = lastProgressReceived, received <= last { return }
        let expected: UInt64 = total > 0 && !isContentEncoded ? UInt64(total) : 0
        let clock = Self.monotonicNs()
        let done = expected > 0 && received >= expected
        let interval = UInt64(request.progressIntervalMs) * 1_000_000
        if !done, lastProgressReceived != nil, clock &- lastProgressNs < interval { return }
        lastProgressNs = clock
        lastProgressReceived = received
        progress(received, expected)
    }

    private static func monotonicNs() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    // MARK: - Result (loop thread, before the handle is reset)

    func result(for code: CURLcode) -> Result<HTTPResponse, TransportError> {
        guard let easy else {
            return .failure(TransportError(kind: .network, message: "no easy handle"))
        }
        var redirects = hops
        getLong(easy, CURLINFO_REDIRECT_COUNT) { redirects += $0 }
        guard code == CURLE_OK else {
            let httpURL = Self.hasScheme(request.url, "http://") || Self.hasScheme(request.url, "https://")
            var kind = TransportError.kind(for: code, capExceeded: capExceeded, httpURL: httpURL,
                                                   redirected: redirects > 0)
            var osErrno = Int(socketErrno.pointee)
            if osErrno == 0 { getLong(easy, CURLINFO_OS_ERRNO) { osErrno = $0 } }
            var text: String
            if refusedResend && code == CURLE_ABORTED_BY_CALLBACK {
                var error = TransportError(
                    kind: .network,
                    message: "the connection closed before any answer to this \(request.method); it is not sent "
                        + "again, since the server may have acted on it (RFC 9112 §9.3.1.1; \"retry\": "
                        + "{\"any_method\": true} retries it)",
                    curlCode: Int(code.rawValue))
                error.metrics = metrics(easy, redirects: redirects)
                return .failure(error)
            }
            if kind == .tooLarge && capExceeded {
                text = "response body exceeds max_response_bytes (\(request.maxResponseBytes) bytes)"
            } else if let framingError {
                text = framingError
            } else if code == CURLE_OUT_OF_MEMORY {
                text = "out of memory, or a response header line over libcurl's limit of 100 KiB"
            } else {
                text = String(cString: errorBuffer)
                if text.isEmpty { text = TransportError.curlText(code) }
                if code == CURLE_WRITE_ERROR, request.acceptEncoding,
                   let coding = headers.last(where: { TransportText.equalsIgnoringASCIICase($0.name, "content-encoding") })
                {
                    // libcurl 7.88 stops so, with words about writing to disk,
                    // at bytes after the end of a compressed body (a second
                    // gzip member, trailing garbage).
                    kind = .badContentEncoding
                    text = "the body could not be decoded from its Content-Encoding \"\(coding.value)\" "
                        + "(data after the end of the compressed stream?): " + text
                }
            }
            kind = TransportError.refinedKind(kind, code: code, text: text)
            if code == CURLE_BAD_FUNCTION_ARGUMENT && answeredSinceRequest {
                // libcurl's code for a malformed trailer of a chunked body
                // ("Failed reading the chunked-encoded stream"): the
                // server's doing, not a bad request (it was FQ_ERR_INVALID,
                // never retried: the tenth review).
                kind = .network
            }
            if kind == .connect && osErrno != 0, let reason = strerror(Int32(osErrno)) {
                // curl says "Couldn't connect to server" for a refused port and
                // for a process out of descriptors alike.
                text += ": " + String(cString: reason)
            }
            var message = "\(text) (curl error \(code.rawValue))"
            if redirects > 0 {
                var at: UnsafePointer<CChar>?
                let url = fqc_easy_getinfo_string(easy, CURLINFO_EFFECTIVE_URL, &at) == CURLE_OK && at != nil
                    ? URLUtilities.redactingPassword(String(cString: at!)) : nil
                if code == CURLE_TOO_MANY_REDIRECTS && hops > 0, let url {
                    message = Self.tooManyRedirects(request.maxRedirects, after: redirects, at: url)
                } else {
                    message += " after \(redirects) redirect\(redirects == 1 ? "" : "s")\(url.map { ", at \($0)" } ?? "")"
                }
            }
            var error = TransportError(kind: kind, message: message, curlCode: Int(code.rawValue))
            error.metrics = metrics(easy, redirects: redirects)
            if kind == .timeout && redirects > 0, let total = error.metrics?.totalMs {
                // curl's "timed out after N milliseconds" counts from the last hop.
                error.message += " (\(Int(total.rounded())) ms in all, timeout_ms \(request.timeoutMs))"
            }
            return .failure(error)
        }
        var status = 0
        getLong(easy, CURLINFO_RESPONSE_CODE) { status = $0 }
        if redirectBodyOverCap {
            // A redirect not followed after all (its Location unusable): its body was cut.
            var error = TransportError(kind: .tooLarge, message: "response body exceeds max_response_bytes (\(request.maxResponseBytes) bytes)",
                                       curlCode: 0)
            error.metrics = metrics(easy, redirects: redirects)
            return .failure(error)
        }
        var effectiveURL = request.url
        var cString: UnsafePointer<CChar>?
        if fqc_easy_getinfo_string(easy, CURLINFO_EFFECTIVE_URL, &cString) == CURLE_OK, let cString {
            effectiveURL = String(cString: cString)
        }
        let response = HTTPResponse(
            status: status, headers: headers, body: body, effectiveURL: effectiveURL,
            metrics: metrics(easy, redirects: redirects))
        headers = []
        body = []
        return .success(response)
    }

    /// What curl measured of this transfer (across the hops it followed
    /// itself and those before, `earlierHopsMs`), also for one that failed.
    private func metrics(_ easy: UnsafeMutableRawPointer, redirects: Int) -> TransferMetrics {
        var metrics = TransferMetrics()
        metrics.connectMs = microseconds(easy, CURLINFO_CONNECT_TIME_T) / 1000
        metrics.firstByteMs = microseconds(easy, CURLINFO_STARTTRANSFER_TIME_T) / 1000
        metrics.totalMs = earlierHopsMs + microseconds(easy, CURLINFO_TOTAL_TIME_T) / 1000
        metrics.bytesReceived = body.count
        metrics.redirects = redirects
        getLong(easy, CURLINFO_HTTP_VERSION) { v in
            switch v {
            case CURL_HTTP_VERSION_1_0: metrics.httpVersion = "1.0"
            case CURL_HTTP_VERSION_1_1: metrics.httpVersion = "1.1"
            case CURL_HTTP_VERSION_2_0: metrics.httpVersion = "2"
            case CURL_HTTP_VERSION_3: metrics.httpVersion = "3"
            default: metrics.httpVersion = ""
            }
        }
        // NUM_CONNECTS counts the new connections this transfer made: 0 with
        // a request sent is a reused connection; 0 with nothing sent is a
        // transfer that never had one (refused, timed out connecting).
        var connects = -1, requestBytes = 0
        getLong(easy, CURLINFO_NUM_CONNECTS) { connects = $0 }
        getLong(easy, CURLINFO_REQUEST_SIZE) { requestBytes = $0 }
        metrics.reusedConnection = connects == 0 && requestBytes > 0
        return metrics
    }

    // MARK: - Redirects followed here (loop thread)

    /// Whether this transfer follows redirects itself rather than curl: for a
    /// method curl sends as CURLOPT_CUSTOMREQUEST (any but HEAD, POST and a
    /// GET without a body), curl 7.88 keeps that method after a 303, where
    /// RFC 9110 §15.4.4 says GET, and sends it without its body after a 301
    /// or 302, where §15.4.2-3 keep both (only POST may become GET there).
    /// (curl 8.13's CURLFOLLOW_OBEYCODE would do this; Debian 12 has 7.88.)
    /// A POST too: curl makes it a GET on 301, 302 and 303 but keeps its
    /// Content-Type and the caller's other Content-* headers, which §15.4
    /// says to remove with the body.
    private var followsItself: Bool {
        guard request.followRedirects else { return false }
        switch request.method {
        case "HEAD": return false
        case "GET": return request.body != nil
        default: return true
        }
    }

    enum Hop {
        /// `request` is now the next hop's: configure and add the handle again.
        case follow
        case fail(TransportError)
    }

    /// For a transfer that ended without a curl error, before its handle is
    /// reset: whether it follows a redirect itself (`followsItself`), or
    /// fails trying; nil when the response is the result.
    ///
    /// The next hop: 303 becomes a GET without the body and its Content-*
    /// headers, and so does a POST on 301 and 302 (as curl and browsers
    /// make it); otherwise 301, 302, 307 and 308 keep the method and the
    /// body. As curl
    /// does for the hops it follows, Authorization and Cookie headers are
    /// not sent to another scheme, host or port; `maxRedirects`, `timeoutMs`
    /// and the http/https restriction count across all hops.
    /// The origin of the request before the redirects followed here, and
    /// the userinfo of its URL.
    private var firstOrigin: String?
    private var firstUserinfo: String?
    /// The first request's headers, and whether a hop made it a GET without
    /// its body (its Content-* headers stay off from then on).
    private var firstHeaders: [(name: String, value: String)] = []
    private var madeAGet = false

    func nextHop() -> Hop? {
        guard let easy else { return nil }
        var status = 0
        getLong(easy, CURLINFO_RESPONSE_CODE) { status = $0 }
        if status == 408 && !resentAfter408 && Self.answeredOnAReusedConnection(easy)
            && (request.timeoutMs == 0 || spentMs() < request.timeoutMs)
        {
            // A server that closes idle connections may answer a request
            // that arrives as it does with 408 (RFC 9110 §15.5.9): the
            // request was not read, so it goes again, once, on a new
            // connection, whatever its method (as browsers do), within
            // what is left of timeout_ms.
            resentAfter408 = true
            earlierHopsMs += microseconds(easy, CURLINFO_TOTAL_TIME_T) / 1000
            resetResponse()
            return .follow
        }
        guard followsItself else { return nil }
        guard Self.followsStatus(status) else { return nil }
        var at: UnsafePointer<CChar>?
        guard fqc_easy_getinfo_string(easy, CURLINFO_REDIRECT_URL, &at) == CURLE_OK, let at else { return nil }
        let target = String(cString: at)
        let place = URLUtilities.redactingPassword(request.url)
        // A failure here reports what was measured, as curl's do
        // (fq_result_metrics: the redirects followed before it).
        func fail(_ kind: TransportError.Kind, _ message: String, curlCode: Int = 0) -> Hop {
            var error = TransportError(kind: kind, message: message, curlCode: curlCode)
            error.metrics = metrics(easy, redirects: hops)
            return .fail(error)
        }
        guard hops < request.maxRedirects else {
            return fail(.tooManyRedirects, Self.tooManyRedirects(request.maxRedirects, after: hops, at: place), curlCode: 47)
        }
        if target.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) {
            // (libcurl: "could not be parsed" for GET and POST)
            return fail(.network, "\(place) redirects (\(status)) to a Location with a control character: "
                + Self.escapingControls(URLUtilities.redactingPassword(target)))
        }
        guard URLUtilities.hostOf(url: target) != nil else {
            return fail(.network, "\(place) redirects (\(status)) to \(URLUtilities.redactingPassword(target)), not an http or https URL with a host")
        }
        let spent = spentMs()
        if request.timeoutMs > 0 && spent >= request.timeoutMs {
            return fail(.timeout, "Operation timed out after \(spent) milliseconds, following a redirect (\(status)) at \(place)",
                        curlCode: 28)
        }
        if hops == 0 {
            firstOrigin = Self.origin(of: request.url)
            firstUserinfo = URLUtilities.userinfo(of: request.url)
            firstHeaders = request.headers
        }
        var next = request
        // As libcurl does for the redirects it follows: credentials go only
        // to the first request's origin, those in a Location included, and
        // the first URL's go on to a Location there that has none.
        if Self.origin(of: target) != firstOrigin {
            next.url = URLUtilities.removingUserinfo(target)
        } else if let firstUserinfo, URLUtilities.userinfo(of: target) == nil {
            next.url = URLUtilities.addingUserinfo(firstUserinfo, to: target)
        } else {
            next.url = target
        }
        if status == 303 || (request.method == "POST" && (status == 301 || status == 302)) {
            next.method = "GET"
            next.body = nil
            madeAGet = true
        }
        // The first request's headers, less what this hop may not carry: as
        // curl does, Authorization and Cookie go only to the first request's
        // origin (again when a later hop leads back there).
        next.headers = firstHeaders
        if madeAGet { next.headers.removeAll { TransportText.hasPrefixIgnoringASCIICase($0.name, "content-") } }
        if Self.origin(of: target) != firstOrigin {
            // Host too: the new origin gets its own (RFC 9112 §3.2), as libcurl does.
            next.headers.removeAll {
                TransportText.equalsIgnoringASCIICase($0.name, "authorization")
                    || TransportText.equalsIgnoringASCIICase($0.name, "cookie")
                    || TransportText.equalsIgnoringASCIICase($0.name, "host")
            }
        }
        earlierHopsMs += microseconds(easy, CURLINFO_TOTAL_TIME_T) / 1000
        hops += 1
        request = next
        resetResponse()
        return .follow
    }

    /// The message of a transfer stopped at `max_redirects` (curl's words,
    /// with the limit the request set: after hops followed here, curl's own
    /// message would name only what was left of it).
    static func tooManyRedirects(_ limit: Int, after redirects: Int, at place: String) -> String {
        "Maximum (\(limit)) redirects followed (curl error 47) after \(redirects) redirect\(redirects == 1 ? "" : "s"), at \(place)"
    }

    /// Milliseconds since the first request of this transfer was configured.
    private func spentMs() -> Int { Int((Self.monotonicNs() &- firstHopNs) / 1_000_000) }

    /// Before the next hop: nothing of this response stays.
    private func resetResponse() {
        headers = []
        body = []
        reserved = false
        capExceeded = false
        headerSectionEnded = false
        declaredLength = -1
        redirectBodyOverCap = false
        stoppedAt304 = false
        errorBuffer[0] = 0
    }

    /// The response came on a connection made for an earlier request, with no
    /// redirect followed by curl.
    private static func answeredOnAReusedConnection(_ easy: UnsafeMutableRawPointer) -> Bool {
        var connects = -1, redirects = -1
        guard fqc_easy_getinfo_long(easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK,
              fqc_easy_getinfo_long(easy, CURLINFO_REDIRECT_COUNT, &redirects) == CURLE_OK else { return false }
        return connects == 0 && redirects == 0
    }

    /// Scheme, host and port, for telling whether a redirect leaves the origin.
    private static func origin(of url: String) -> String? {
        guard let host = URLUtilities.hostOf(url: url) else { return nil }
        return (hasScheme(url, "https://") ? "https://" : "http://") + host
    }

    private func getLong(_ easy: UnsafeMutableRawPointer, _ info: CURLINFO, _ use: (Int) -> Void) {
        var value = 0
        if fqc_easy_getinfo_long(easy, info, &value) == CURLE_OK { use(value) }
    }

    private func microseconds(_ easy: UnsafeMutableRawPointer, _ info: CURLINFO) -> Double {
        var value: curl_off_t = 0
        return fqc_easy_getinfo_off(easy, info, &value) == CURLE_OK ? Double(value) : 0
    }

    /// `text` with each control character written `\xHH`.
    static func escapingControls(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F {
                let hex = String(scalar.value, radix: 16, uppercase: true)
                out += "\\x" + (hex.count < 2 ? "0" : "") + hex
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}

// MARK: - C entry points (no captures, so they convert to C function pointers)

private func transfer(_ userdata: UnsafeMutableRawPointer?) -> CurlTransfer {
    Unmanaged<CurlTransfer>.fromOpaque(userdata!).takeUnretainedValue()
}

private let curlWriteBody: curl_write_callback = { data, size, count, userdata in
    let n = size * count
    guard n > 0, let data else { return 0 }
    return transfer(userdata).receiveBody(data, n)
}

private let curlWriteHeader: curl_write_callback = { data, size, count, userdata in
    let n = size * count
    guard n > 0, let data else { return 0 }
    return transfer(userdata).receiveHeader(data, n)
}

private let curlProgress: curl_xferinfo_callback = { userdata, dltotal, dlnow, _, _ in
    transfer(userdata).transferred(total: dltotal, now: dlnow) ? 0 : 1
}

private let curlBeforeRequest: curl_prereq_callback = { userdata, _, _, _, _ in
    transfer(userdata).beforeRequest() ? CURL_PREREQFUNC_OK : CURL_PREREQFUNC_ABORT
}
