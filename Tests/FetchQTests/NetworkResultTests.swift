import CJansson
@testable import FetchQ
import Glibc
import Testing

/// A network result's headers, metrics and C copy of the body are built on
/// first read: the same values as building them at once, built only once.
@Suite struct NetworkResultTests {
    static let headerList: [(name: String, value: String)] = [
        ("Content-Type", "application/json"), ("Set-Cookie", "a=1"), ("X-Empty", ""),
        ("set-cookie", "b=2"), ("Last-Modified", "Sat, 21 Nov 2026 20:53:41 GMT"),
    ]

    static func response() -> HTTPResponse {
        var metrics = TransferMetrics()
        metrics.connectMs = 1.5
        metrics.firstByteMs = 2.25
        metrics.totalMs = 3
        metrics.bytesReceived = 42
        metrics.redirects = 1
        metrics.httpVersion = "1.1"
        metrics.reusedConnection = true
        return HTTPResponse(status: 203, headers: headerList, body: Array("{\"k\": [1, 2]}".utf8),
                            effectiveURL: "http://example.test/x", metrics: metrics)
    }

    @Test func headersAreTheEagerObject() throws {
        let info = HTTPInfo(Self.response(), queueWaitMs: 0.5, attempts: 2, fromCache: false)
        let headers = try #require(info.headers)
        #expect(headers.dumps() == NetworkJob.headers(Self.headerList).dumps())
        #expect(headers.dumps() == #"{"content-type":"application/json","set-cookie":"a=1, b=2","x-empty":"","last-modified":"Sat, 21 Nov 2026 20:53:41 GMT"}"#)
        // Built once: every read (and every copy of the value) shares it.
        let copy = info
        #expect(info.headers?.pointer == headers.pointer)
        #expect(copy.headers?.pointer == headers.pointer)
        #expect(info.status == 203)
    }

    @Test(arguments: [false, true])
    func metricsAreTheEagerObject(fromCache: Bool) throws {
        let info = HTTPInfo(Self.response(), queueWaitMs: 0.5, attempts: 2, fromCache: fromCache)
        let metrics = try #require(info.metrics)
        #expect(metrics.dumps() == """
            {"queue_wait_ms":0.5,"connect_ms":1.5,"first_byte_ms":2.25,"total_ms":3.0,"bytes":42,"redirects":1,\
            "http_version":"1.1","reused_connection":true,"attempts":2,"from_cache":\(fromCache)}
            """)
        #expect(info.metrics?.pointer == metrics.pointer)
        #expect(info.fromCache == fromCache)
    }

    @Test func noResponseHasMetricsOnly() throws {
        let info = HTTPInfo(queueWaitMs: 1.25, attempts: 3)
        #expect(info.status == 0)
        #expect(info.headers == nil)
        #expect(info.body.isEmpty)
        #expect(info.bodyBytes == nil)
        let metrics = try #require(info.metrics)
        // Every documented key, "from_cache" included.
        #expect(metrics.dumps() == """
            {"queue_wait_ms":1.25,"connect_ms":0.0,"first_byte_ms":0.0,"total_ms":0.0,"bytes":0,"redirects":0,\
            "http_version":"","reused_connection":false,"attempts":3,"from_cache":false}
            """)
        // What curl measured before the transfer failed.
        var measured = TransferMetrics()
        measured.connectMs = 0.5
        measured.totalMs = 300.25
        measured.redirects = 2
        let failed = HTTPInfo(queueWaitMs: 0, attempts: 1, measured: measured)
        #expect(failed.metrics?.dumps() == """
            {"queue_wait_ms":0.0,"connect_ms":0.5,"first_byte_ms":0.0,"total_ms":300.25,"bytes":0,"redirects":2,\
            "http_version":"","reused_connection":false,"attempts":1,"from_cache":false}
            """)
    }

    @Test func bodyBytesAreACopyAtOneAddress() throws {
        let info = HTTPInfo(Self.response(), queueWaitMs: 0, attempts: 1, fromCache: false)
        let bytes = try #require(info.bodyBytes)
        #expect(Array(bytes) == info.body)
        #expect(info.bodyBytes?.baseAddress == bytes.baseAddress)
        let empty = HTTPResponse(status: 204, headers: [], body: [], effectiveURL: "", metrics: TransferMetrics())
        #expect(HTTPInfo(empty, queueWaitMs: 0, attempts: 1, fromCache: false).bodyBytes == nil)
    }

    /// Up to 64 KiB the body is copied when the result is made; a larger one
    /// on the first bodyBytes, once, also when threads race for it. Both give
    /// the body's bytes at one address, and the lazy value parses either.
    @Test(arguments: [HTTPDetails.eagerCopyLimit, HTTPDetails.eagerCopyLimit + 1, 1 << 20])
    func bodiesOfEverySizeAreAtOneAddress(size: Int) throws {
        let text = "[" + String(repeating: "1,", count: (size - 3) / 2) + String(repeating: " ", count: (size - 3) % 2) + "1]"
        let bytes = Array(text.utf8)
        #expect(bytes.count == size)
        for _ in 0..<10 {
            let info = HTTPInfo(HTTPResponse(status: 200, headers: [], body: bytes, effectiveURL: "", metrics: TransferMetrics()),
                                queueWaitMs: 0, attempts: 1, fromCache: false)
            let seen = TestCollector<UInt>()
            runThreads(4) { _ in seen.add(UInt(bitPattern: info.bodyBytes?.baseAddress)) }
            let all = try #require(seen.wait(for: 4, timeout: 10))
            #expect(Set(all).count == 1 && all[0] != 0)
            #expect(info.bodyBytes.map(Array.init) == bytes && info.body == bytes)
            var lazy = info  // the same details
            lazy.lazyValueDepth = 8
            #expect(lazy.parsedBody.map { json_array_size($0.pointer) } == (size - 1) / 2)
        }
    }

    @Test func concurrentFirstReadsGetOneObject() throws {
        for _ in 0..<50 {
            let info = HTTPInfo(Self.response(), queueWaitMs: 0, attempts: 1, fromCache: false)
            let seen = TestCollector<[UInt]>()
            runThreads(8) { _ in
                seen.add([UInt(bitPattern: info.headers?.pointer), UInt(bitPattern: info.metrics?.pointer),
                          UInt(bitPattern: info.bodyBytes?.baseAddress)])
            }
            let all = try #require(seen.wait(for: 8, timeout: 10))
            #expect(Set(all).count == 1)
            #expect(all[0].allSatisfy { $0 != 0 })
        }
    }

    @Test func resultExposesTheLazyParts() throws {
        let job = NetworkJob(request: HTTPRequest(url: "http://example.test/x"), host: "example.test:80",
                                 maxJSONDepth: 64)
        let result = job.result(id: 7, .success(Self.response()), queueWaitMs: 0, attempts: 1, cancelled: false,
                                historyForm: true)
        #expect(result.outcome == .succeeded)
        #expect(result.value?.dumps() == #"{"k":[1,2]}"#)
        #expect(result.bodyBytes.map(Array.init) == Array("{\"k\": [1, 2]}".utf8))
        #expect(result.bodyBytes?.baseAddress == result.http?.bodyBytes?.baseAddress)
        #expect(result.http?.headers?.at("/set-cookie")?.stringValue == "a=1, b=2")
        #expect(result.http?.metrics?.at("/from_cache")?.boolValue == false)
    }

    /// "lazy_parse": the result says it has a value without building it; the
    /// first read builds it, every read (from any thread) returns that one.
    @Test func aLazyValueIsBuiltOnceOnFirstRead() throws {
        var job = NetworkJob(request: HTTPRequest(url: "http://example.test/x"), host: "example.test:80",
                             maxJSONDepth: 64)
        job.lazyParse = true
        for _ in 0..<20 {
            let result = job.result(id: 8, .success(Self.response()), queueWaitMs: 0, attempts: 1, cancelled: false,
                                    historyForm: true)
            #expect(result.outcome == .succeeded)
            #expect(result.hasValue)
            #expect(result.http?.lazyValueDepth == 64)
            let seen = TestCollector<UInt>()
            runThreads(6) { _ in seen.add(UInt(bitPattern: result.value?.pointer)) }
            let all = try #require(seen.wait(for: 6, timeout: 10))
            #expect(Set(all).count == 1 && all[0] != 0)
            #expect(result.value?.dumps() == #"{"k":[1,2]}"#)
        }
        // Not JSON: the same failure as an eager parse, no value.
        var bad = Self.response()
        bad.body = Array("{\"k\": [1, 2]".utf8)
        let failed = job.result(id: 9, .success(bad), queueWaitMs: 0, attempts: 1, cancelled: false, historyForm: true)
        job.lazyParse = false
        let eager = job.result(id: 9, .success(bad), queueWaitMs: 0, attempts: 1, cancelled: false, historyForm: true)
        #expect(failed.status == .parse && !failed.hasValue && failed.value == nil)
        #expect(failed.message == eager.message)
    }
}

/// Submit-side keys and defaults that were rewritten for speed keep their values.
@Suite struct NetworkJobKeyTests {
    /// Two GETs share a transfer exactly when their keys are equal: the same URL, headers
    /// (name case and order aside), limits, cache mode and max_wait_ms.
    @Test func coalesceKeysAreEqualExactlyForTheSameTransfer() throws {
        func job() -> NetworkJob {
            NetworkJob(request: HTTPRequest(url: "http://example.test/a?q=é"), host: "example.test:80", maxJSONDepth: 64)
        }
        let base = try #require(job().coalesceKey(maxWaitMs: 0))
        #expect(job().coalesceKey(maxWaitMs: 0) == base)
        #expect(job().coalesceKey(maxWaitMs: 0)?.hashValue == base.hashValue)
        #expect(job().coalesceKey(maxWaitMs: 5) != base)
        // Headers: names in any case and order give the same key; values do not.
        var a = job()
        a.request.headers = [("X-B", "2"), ("accept", "application/json"), ("x-a", "1")]
        var b = job()
        b.request.headers = [("x-a", "1"), ("X-B", "2"), ("Accept", "application/json")]
        #expect(a.coalesceKey(maxWaitMs: 0) == b.coalesceKey(maxWaitMs: 0))
        #expect(a.coalesceKey(maxWaitMs: 0) != base)
        b.request.headers[0] = ("x-a", "2")
        #expect(a.coalesceKey(maxWaitMs: 0) != b.coalesceKey(maxWaitMs: 0))
        // Values by their bytes: "\u{E9}" and "e\u{301}" are two requests to a
        // server (Swift's String equality made them one transfer).
        var composed = job(), decomposed = job()
        composed.request.headers = [("X-Name", "\u{E9}")]
        decomposed.request.headers = [("X-Name", "e\u{301}")]
        #expect(composed.coalesceKey(maxWaitMs: 0) != decomposed.coalesceKey(maxWaitMs: 0))
        composed.request.userAgent = "\u{E9}"
        decomposed.request.headers = composed.request.headers
        decomposed.request.userAgent = "e\u{301}"
        #expect(composed.coalesceKey(maxWaitMs: 0) != decomposed.coalesceKey(maxWaitMs: 0))
        // Every limit that shapes the transfer is part of it.
        let changes: [(String, (inout NetworkJob) -> Void)] = [
            ("url", { $0.request.url = "http://example.test/b" }),
            ("connect timeout", { $0.request.connectTimeoutMs = 1500 }),
            ("timeout", { $0.request.timeoutMs = 1 }),
            ("redirects followed", { $0.request.followRedirects.toggle() }),
            ("max redirects", { $0.request.maxRedirects = 0 }),
            ("max response bytes", { $0.request.maxResponseBytes = 1 << 20 }),
            ("TLS verification", { $0.request.verifyTLS.toggle() }),
            ("CA file", { $0.request.caFile = "/etc/ca.pem" }),
            ("user agent", { $0.request.userAgent = "agent/1.0 (x)" }),
            ("progress", { $0.progressIntervalMs = 250 }),
            ("cache mode", { $0.cache = .reload }),
            ("retry", { $0.retry.max = 3 }),
        ]
        for (what, change) in changes {
            var changed = job()
            change(&changed)
            #expect(changed.coalesceKey(maxWaitMs: 0) != nil, "\(what)")
            #expect(changed.coalesceKey(maxWaitMs: 0) != base, "\(what) is not part of the key")
        }
        // Never shared: other methods, a body, cache modes that are per caller, coalesce off.
        var other = job()
        other.request.method = "POST"
        #expect(other.coalesceKey(maxWaitMs: 0) == nil)
        other = job()
        other.request.body = [1]
        #expect(other.coalesceKey(maxWaitMs: 0) == nil)
        for mode in [NetworkJob.CacheMode.onlyIfCached, .staleWhileRevalidate] {
            other = job()
            other.cache = mode
            #expect(other.coalesceKey(maxWaitMs: 0) == nil)
        }
        other = job()
        other.coalesce = false
        #expect(other.coalesceKey(maxWaitMs: 0) == nil)
    }

    /// delay-seconds has no upper bound (RFC 9110 §10.2.3): one too large for
    /// an Int waits max_delay; it used to be dropped for the backoff.
    @Test func retryAfterBeyondAnIntWaitsMaxDelay() {
        #expect(RetryPolicy.retryAfter("120", now: 0) == 120)
        #expect(RetryPolicy.retryAfter(" 0 ", now: 0) == 0)
        #expect(RetryPolicy.retryAfter("99999999999999999999", now: 0) == .infinity)
        #expect(RetryPolicy.retryAfter("9223372036854775808", now: 0) == .infinity)
        #expect(RetryPolicy.retryAfter("+5", now: 0) == nil)
        #expect(RetryPolicy.retryAfter("-1", now: 0) == nil)
        #expect(RetryPolicy.retryAfter("", now: 0) == nil)
        var policy = RetryPolicy()
        policy.max = 3
        policy.maxDelay = 3
        let busy = HTTPResponse(status: 503, headers: [(name: "Retry-After", value: "99999999999999999999")],
                                body: [], effectiveURL: "http://example.test/", metrics: TransferMetrics())
        #expect(policy.delay(after: .success(busy), attempt: 1, method: "GET", now: 0) == 3)
    }

    /// Option "retry" "on" lists what is retried: what it leaves out is not,
    /// timeouts and network errors included (they are retried by default).
    @Test func retryOnListsExactlyWhatIsRetried() throws {
        func policy(_ text: String) throws -> RetryPolicy {
            let json = try JSONParser.parse(text, maxDepth: 8)
            var r = try OptionReader(json.pointer, context: "options.retry")
            return try RetryPolicy(reading: &r)
        }
        let timeout = Result<HTTPResponse, TransportError>.failure(TransportError(kind: .timeout, message: "timed out"))
        let reset = Result<HTTPResponse, TransportError>.failure(TransportError(kind: .network, message: "reset"))
        let unavailable = Result<HTTPResponse, TransportError>.success(
            HTTPResponse(status: 503, headers: [], body: [], effectiveURL: "http://example.test/", metrics: TransferMetrics()))
        func retried(_ p: RetryPolicy, _ outcome: Result<HTTPResponse, TransportError>) -> Bool {
            p.delay(after: outcome, attempt: 1, method: "GET", now: 0) != nil
        }
        let defaults = try policy(#"{"max": 1}"#)
        #expect(retried(defaults, timeout) && retried(defaults, reset) && retried(defaults, unavailable))
        let statusOnly = try policy(#"{"max": 1, "on": [503]}"#)
        #expect(retried(statusOnly, unavailable))
        #expect(!retried(statusOnly, timeout))
        #expect(!retried(statusOnly, reset))
        let timeoutOnly = try policy(#"{"max": 1, "on": ["timeout"]}"#)
        #expect(retried(timeoutOnly, timeout))
        #expect(!retried(timeoutOnly, reset) && !retried(timeoutOnly, unavailable))
    }

    /// Exponential backoff: retry n waits base * 2^(n-1), capped at
    /// max_delay, times a factor in [0.5, 1] (fetchq.h, option "retry").
    /// Checked on the policy itself, with no clock: the engine test of the
    /// same retries only sees their sum.
    @Test func backoffStaysWithinItsJitterAndCap() {
        var policy = RetryPolicy()
        policy.max = 40
        policy.base = 0.2
        policy.maxDelay = 10
        let failed = Result<HTTPResponse, TransportError>.failure(TransportError(kind: .network, message: "reset"))
        let unavailable = HTTPResponse(status: 503, headers: [], body: [], effectiveURL: "http://example.test/",
                                       metrics: TransferMetrics())
        for attempt in 1...40 {
            let full = min(10, 0.2 * Double(1 << min(attempt - 1, 30)))
            var lowest = Double.infinity
            var highest = 0.0
            for outcome in [failed, .success(unavailable)] {
                for _ in 0..<200 {
                    let d = policy.delay(after: outcome, attempt: attempt, method: "GET", now: 0)
                    guard let d else {
                        Issue.record("attempt \(attempt): no retry")
                        return
                    }
                    lowest = min(lowest, d)
                    highest = max(highest, d)
                }
            }
            #expect(lowest >= full * 0.5, "attempt \(attempt): \(lowest) below half of \(full)")
            #expect(highest <= full, "attempt \(attempt): \(highest) above \(full)")
            // 400 draws spread over the range: not a constant factor.
            #expect(highest - lowest > full * 0.25, "attempt \(attempt): \(lowest)...\(highest)")
        }
        // Past the last retry: no more.
        #expect(policy.delay(after: failed, attempt: 41, method: "GET", now: 0) == nil)
        // A zero base with no cap left: no wait at all.
        policy.base = 0
        #expect(policy.delay(after: failed, attempt: 3, method: "GET", now: 0) == 0)
    }

    @Test func defaultRetryStatuses() {
        #expect(RetryPolicy().statuses == [408, 429, 500, 502, 503, 504])
        var changed = RetryPolicy()
        changed.statuses.insert(418)
        #expect(RetryPolicy().statuses.count == 6)  // the shared default is not changed
    }
}
