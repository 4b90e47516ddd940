import FetchQ
import Glibc
import Testing

/// What goes out and what comes back: methods, headers, bodies, status codes,
/// redirects, size caps, content encodings, request validation.
@Suite("Transport: requests and responses")
struct TransportRequestTests {
    let server: TestServer
    let transport: CurlTransport

    init() throws {
        server = try TestServer()
        transport = try CurlTransport()
    }

    // MARK: Methods, headers, bodies

    @Test("method, query, headers and body round-trip through /echo",
          arguments: ["GET", "POST", "PUT", "DELETE", "PATCH", "PURGE"])
    func echoRoundTrip(method: String) throws {
        // UTF-8 with a NUL in the middle: binary-safe sending, and the echo
        // (which decodes the body as UTF-8) can still show it exactly.
        let body: [UInt8]? = ["GET", "DELETE"].contains(method)
            ? nil : Array("héllo\u{0}wörld {\"k\":[1,2]}".utf8)
        let request = HTTPRequest(
            method: method, url: server.url("/echo?x=1&y=two%20words"),
            headers: [(name: "X-Test", value: "value 1"), (name: "X-Empty", value: ""),
                      (name: "Authorization", value: "Bearer secret")],
            body: body)
        let response = try transport.perform(request).get()
        #expect(response.status == 200)
        let echo = try #require(TestJSON(parsing: response.body))
        #expect(echo["method"]?.string == method)
        #expect(echo["path"]?.string == "/echo")
        #expect(echo["query"]?["x"]?.string == "1")
        #expect(echo["query"]?["y"]?.string == "two words")
        let headers = try #require(echo["headers"])
        #expect(headers["x-test"]?.string == "value 1")
        #expect(headers["x-empty"]?.string == "")
        #expect(headers["authorization"]?.string == "Bearer secret")
        #expect(headers["user-agent"]?.string == "fetchq")
        #expect(headers["expect"] == nil)
        if let body {
            #expect(echo["body"]?.string == String(decoding: body, as: UTF8.self))
            #expect(headers["content-length"]?.string == String(body.count))
            // curl's form-urlencoded default is not sent.
            #expect(headers["content-type"] == nil)
        } else {
            #expect(echo["body"]?.string == "")
            #expect(headers["content-length"] == nil)
        }
    }

    @Test("a value of only spaces or tabs is sent empty, and still replaces a header curl would send")
    func blankHeaderValues() throws {
        let response = try transport.perform(HTTPRequest(
            method: "POST", url: server.url("/echo"),
            headers: [(name: "X-Blank", value: " \t "), (name: "Accept", value: "  "),
                      (name: "User-Agent", value: "\t"), (name: "Content-Type", value: " ")],
            body: Array("x".utf8))).get()
        let headers = try #require(TestJSON(parsing: response.body)?["headers"])
        for name in ["x-blank", "accept", "user-agent", "content-type"] {
            #expect(headers[name]?.string == "", "\(name)")
        }
    }

    @Test("an explicit Content-Type is sent; an empty body is Content-Length: 0")
    func contentTypeAndEmptyBody() throws {
        let withType = try transport.perform(HTTPRequest(
            method: "POST", url: server.url("/echo"),
            headers: [(name: "Content-Type", value: "application/json")], body: Array("{}".utf8))).get()
        let echo = try #require(TestJSON(parsing: withType.body))
        #expect(echo["headers"]?["content-type"]?.string == "application/json")
        #expect(echo["body"]?.string == "{}")

        let empty = try transport.perform(HTTPRequest(method: "PUT", url: server.url("/echo"), body: [])).get()
        let emptyEcho = try #require(TestJSON(parsing: empty.body))
        #expect(emptyEcho["method"]?.string == "PUT")
        #expect(emptyEcho["headers"]?["content-length"]?.string == "0")
    }

    @Test("an explicit Expect: 100-continue works; the 100 response's headers are not kept")
    func expectContinue() throws {
        let body = Array(String(repeating: "0123456789", count: 1000).utf8)
        let response = try transport.perform(HTTPRequest(
            method: "POST", url: server.url("/echo"), headers: [(name: "Expect", value: "100-continue")],
            body: body)).get()
        #expect(response.status == 200)
        #expect(response.headers.map(\.name) == ["Content-Type", "Content-Length", "Server", "Date"])
        let echo = try #require(TestJSON(parsing: response.body))
        #expect(echo["headers"]?["expect"]?.string == "100-continue")
        #expect(echo["body"]?.string?.utf8.count == body.count)
    }

    @Test("a 3 MB request body arrives whole")
    func largeUpload() throws {
        let body = [UInt8](repeating: UInt8(ascii: "z"), count: 3 << 20)
        let response = try transport.perform(HTTPRequest(method: "POST", url: server.url("/echo"), body: body)).get()
        let echo = try #require(TestJSON(parsing: response.body))
        #expect(echo["headers"]?["content-length"]?.string == String(body.count))
        #expect(echo["body"]?.string?.utf8.count == body.count)
    }

    @Test("HEAD returns headers only and does not wait for a body")
    func head() throws {
        let response = try transport.perform(HTTPRequest(method: "HEAD", url: server.url("/bytes?n=5000"))).get()
        #expect(response.status == 200)
        #expect(response.body.isEmpty)
        #expect(response.header("content-length") == "5000")
        #expect(response.header("Content-Type") == "application/octet-stream")
    }

    @Test("status codes are delivered as responses, not errors",
          arguments: [200, 201, 204, 301, 400, 404, 418, 500, 503])
    func statusCodes(code: Int) throws {
        let response = try transport.perform(HTTPRequest(url: server.url("/status/\(code)"))).get()
        #expect(response.status == code)
        if code == 204 {
            #expect(response.body.isEmpty)
        } else {
            #expect(TestJSON(parsing: response.body)?["status"]?.int == code)
        }
    }

    @Test("response headers: in order, final response only; metrics filled in")
    func responseHeadersAndMetrics() throws {
        let response = try transport.perform(HTTPRequest(url: server.url("/redirect?n=2"))).get()
        #expect(response.status == 200)
        // The two 302s carried Location and their own Content-Length; none may leak.
        #expect(response.headers.map(\.name) == ["Content-Type", "Content-Length", "Server", "Date"])
        #expect(response.header("location") == nil)
        #expect(response.header("content-length") == String(response.body.count))
        #expect(response.effectiveURL == server.url("/json"))
        #expect(TestJSON(parsing: response.body)?["items"] != nil)
        let m = response.metrics
        #expect(m.redirects == 2)
        #expect(m.httpVersion == "1.1")
        #expect(m.bytesReceived == response.body.count)
        #expect(m.totalMs > 0)
        #expect(m.firstByteMs <= m.totalMs)
        #expect(m.connectMs <= m.firstByteMs)
    }

    // MARK: Redirects

    @Test("a redirect chain up to the cap is followed")
    func redirectsWithinCap() throws {
        let response = try transport.perform(HTTPRequest(url: server.url("/redirect?n=5"), maxRedirects: 5)).get()
        #expect(response.status == 200)
        #expect(response.metrics.redirects == 5)
    }

    @Test("one redirect over the cap, and a loop, fail with .tooManyRedirects",
          arguments: ["/redirect?n=6", "/redirect-loop"])
    func tooManyRedirects(path: String) throws {
        let error = try #require(transport.perform(HTTPRequest(url: server.url(path), maxRedirects: 5)).error)
        #expect(error.kind == .tooManyRedirects)
        #expect(error.curlCode == 47)
        #expect(error.message.contains("redirect"))
    }

    @Test("followRedirects false returns the 3xx itself")
    func redirectNotFollowed() throws {
        let response = try transport.perform(HTTPRequest(url: server.url("/redirect?n=2"), followRedirects: false)).get()
        #expect(response.status == 302)
        #expect(response.header("Location") == "/redirect?n=1")
        #expect(response.metrics.redirects == 0)
    }

    @Test("Authorization and Cookie headers are not sent to another host on redirect")
    func credentialsStayOnHost() throws {
        let headers = [(name: "Authorization", value: "Bearer secret"), (name: "Cookie", value: "session=1"),
                       (name: "X-Other", value: "kept")]
        // Same host: kept.
        let same = try transport.perform(HTTPRequest(
            url: server.url("/redirect-to?url=/echo"), headers: headers)).get()
        let sameEcho = try #require(TestJSON(parsing: same.body)?["headers"])
        #expect(sameEcho["authorization"]?.string == "Bearer secret")
        #expect(sameEcho["cookie"]?.string == "session=1")
        // Another host name (same server, reached as "localhost"): dropped.
        let other = try transport.perform(HTTPRequest(
            url: server.url("/redirect-to?url=http://localhost:\(server.port)/echo"), headers: headers)).get()
        #expect(other.effectiveURL == "http://localhost:\(server.port)/echo")
        let otherEcho = try #require(TestJSON(parsing: other.body)?["headers"])
        #expect(otherEcho["authorization"] == nil)
        #expect(otherEcho["cookie"] == nil)
        #expect(otherEcho["x-other"]?.string == "kept")
    }

    /// Redirects fetchq follows itself (a POST, PUT...): a Host header set by
    /// the caller goes only to the first request's origin, as libcurl does for
    /// a GET's (the twelfth review: the new origin got the first's Host).
    @Test(arguments: ["GET", "POST", "PUT"])
    func aHostHeaderIsNotSentToAnotherOrigin(method: String) throws {
        let response = try transport.perform(HTTPRequest(
            method: method, url: server.url("/redirect-to?url=http://localhost:\(server.port)/echo&status=307"),
            headers: [(name: "Host", value: "example.com")], body: method == "GET" ? nil : Array("x".utf8))).get()
        #expect(response.status == 200)
        #expect(response.metrics.redirects == 1)
        let echo = try #require(TestJSON(parsing: response.body))
        #expect(echo["method"]?.string == method)
        #expect(echo["headers"]?["host"]?.string == "localhost:\(server.port)")
    }

    /// A redirect's own body is not the response: over max_response_bytes it
    /// does not fail a redirect fetchq follows itself, as it does not fail
    /// one libcurl follows (the twelfth review: a POST failed "too large").
    @Test(arguments: ["GET", "POST", "PUT"])
    func aRedirectsBodyDoesNotCountAgainstTheCap(method: String) throws {
        let spec = URLUtilities.percentEncode("307;Location=/echo;body=" + String(repeating: "x", count: 4000))
        let response = try transport.perform(HTTPRequest(
            method: method, url: server.url("/steps?key=cap-\(method)&s=\(spec)"),
            body: method == "GET" ? nil : Array("y".utf8), maxResponseBytes: 2000)).get()
        #expect(response.status == 200)
        #expect(response.metrics.redirects == 1)
        let echo = try #require(TestJSON(parsing: response.body))
        #expect(echo["method"]?.string == method)
        #expect(response.body.count <= 2000)
        // The cap still holds for the response itself.
        let bigSpec = URLUtilities.percentEncode("200;body=" + String(repeating: "z", count: 4000))
        let big = try transport.perform(HTTPRequest(
            method: method, url: server.url("/steps?key=capbig-\(method)&s=\(bigSpec)"),
            body: method == "GET" ? nil : Array("y".utf8), maxResponseBytes: 2000))
        #expect(big.error?.kind == .tooLarge)
    }

    @Test("POST becomes GET after 303 and stays POST with its body after 307")
    func redirectMethodRules() throws {
        let body = Array("payload".utf8)
        let after303 = try transport.perform(HTTPRequest(
            method: "POST", url: server.url("/redirect-to?url=/echo&status=303"), body: body)).get()
        #expect(TestJSON(parsing: after303.body)?["method"]?.string == "GET")
        let after307 = try transport.perform(HTTPRequest(
            method: "POST", url: server.url("/redirect-to?url=/echo&status=307"), body: body)).get()
        let echo = try #require(TestJSON(parsing: after307.body))
        #expect(echo["method"]?.string == "POST")
        #expect(echo["body"]?.string == "payload")
    }

    @Test("PUT, PATCH and DELETE keep their method and body through 301, 302, 307 and 308; 303 makes a GET without the body and its Content-* headers, and so do 301 and 302 for a POST",
          arguments: ["PUT", "PATCH", "DELETE", "POST"], [301, 302, 303, 307, 308])
    func customMethodRedirects(method: String, status: Int) throws {
        let body = Array("important data".utf8)
        let response = try transport.perform(HTTPRequest(
            method: method, url: server.url("/redirect-to?url=/echo&status=\(status)"),
            headers: [(name: "Content-Type", value: "text/plain"), (name: "X-Kept", value: "1")],
            body: body)).get()
        #expect(response.status == 200)
        #expect(response.metrics.redirects == 1)
        #expect(response.effectiveURL == server.url("/echo"))
        let echo = try #require(TestJSON(parsing: response.body))
        let headers = try #require(echo["headers"])
        #expect(headers["x-kept"]?.string == "1")
        if status == 303 || (method == "POST" && status <= 302) {
            #expect(echo["method"]?.string == "GET")
            #expect(echo["body"]?.string == "")
            #expect(headers["content-type"] == nil)
            #expect(headers["content-length"] == nil)
        } else {
            #expect(echo["method"]?.string == method)
            #expect(echo["body"]?.string == "important data")
            #expect(headers["content-type"]?.string == "text/plain")
            #expect(headers["content-length"]?.string == String(body.count))
        }
    }

    @Test("fetchq's own hops: a 300 with a Location is followed as a 307 is; credentials go back with a hop to the first origin",
          arguments: ["POST", "PUT"])
    func ownHopsFollowOther3xxAndReturnCredentials(method: String) throws {
        let body = Array("data".utf8)
        let after300 = try transport.perform(HTTPRequest(
            method: method, url: server.url("/redirect-to?url=/echo&status=300"), body: body)).get()
        let echo = try #require(TestJSON(parsing: after300.body))
        #expect(after300.status == 200 && echo["method"]?.string == method && echo["body"]?.string == "data")
        // 127.0.0.1 -> localhost -> 127.0.0.1: curl's rule, the first origin's.
        let back = URLUtilities.percentEncode(server.url("/echo"))
        let away = URLUtilities.percentEncode("http://localhost:\(server.port)/redirect-to?url=\(back)&status=307")
        let credentials = [(name: "Authorization", value: "Bearer secret"), (name: "Cookie", value: "s=1")]
        let round = try transport.perform(HTTPRequest(
            method: method, url: server.url("/redirect-to?url=\(away)&status=307"), headers: credentials,
            body: body)).get()
        #expect(round.metrics.redirects == 2)
        let headers = try #require(TestJSON(parsing: round.body)?["headers"])
        #expect(headers["authorization"]?.string == "Bearer secret")
        #expect(headers["cookie"]?.string == "s=1")
    }

    @Test("a PUT's redirects: the cap, a chain that goes on as GET, another host, another scheme, not following")
    func customMethodRedirectLimits() throws {
        let body = Array("data".utf8)
        // /redirect?n=2 answers 302 twice: within a cap of 2, one over a cap of 1.
        let within = try transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect?n=2"), body: body, maxRedirects: 2)).get()
        #expect(within.status == 200)
        #expect(within.metrics.redirects == 2)
        #expect(within.effectiveURL == server.url("/json"))
        let over = try #require(transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect?n=2"), body: body, maxRedirects: 1)).error)
        #expect(over.kind == .tooManyRedirects)
        #expect(over.message.contains("Maximum (1) redirects followed"), "\(over.message)")
        #expect(over.metrics?.redirects == 1)  // what was followed before it failed
        let loop = try #require(transport.perform(HTTPRequest(
            method: "DELETE", url: server.url("/redirect-loop"))).error)
        #expect(loop.kind == .tooManyRedirects)
        // A 303 makes it a GET, whose further redirects curl follows: all count.
        let inner = "/redirect?n=2"
        let chained = try transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=\(URLUtilities.percentEncode(inner))&status=303"),
            body: body, maxRedirects: 3)).get()
        #expect(chained.metrics.redirects == 3)
        #expect(chained.effectiveURL == server.url("/json"))
        let chainedOver = try #require(transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=\(URLUtilities.percentEncode(inner))&status=303"),
            body: body, maxRedirects: 2)).error)
        #expect(chainedOver.kind == .tooManyRedirects)
        // The request's limit, not what was left of it when curl took over.
        #expect(chainedOver.message.hasPrefix("Maximum (2) redirects followed (curl error 47) after 2 redirects"),
                "\(chainedOver.message)")
        #expect(chainedOver.metrics?.redirects == 2)
        // Credentials stay on their host.
        let credentials = [(name: "Authorization", value: "Bearer secret"), (name: "Cookie", value: "s=1")]
        let same = try transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=/echo&status=307"), headers: credentials,
            body: body)).get()
        #expect(TestJSON(parsing: same.body)?["headers"]?["authorization"]?.string == "Bearer secret")
        let target = URLUtilities.percentEncode("http://localhost:\(server.port)/echo")
        let other = try transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=\(target)&status=307"), headers: credentials,
            body: body)).get()
        let otherEcho = try #require(TestJSON(parsing: other.body))
        #expect(otherEcho["method"]?.string == "PUT")
        #expect(otherEcho["body"]?.string == "data")
        #expect(otherEcho["headers"]?["authorization"] == nil)
        #expect(otherEcho["headers"]?["cookie"] == nil)
        // Another scheme: refused, naming both URLs.
        let ftp = try #require(transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=ftp://127.0.0.1/file&status=308"), body: body)).error)
        #expect(ftp.kind == .network)
        #expect(ftp.message.contains("to ftp://127.0.0.1/file, not an http or https URL"), "\(ftp.message)")
        // Not following: the redirect is the response.
        let kept = try transport.perform(HTTPRequest(
            method: "PUT", url: server.url("/redirect-to?url=/echo&status=302"), body: body,
            followRedirects: false)).get()
        #expect(kept.status == 302)
        #expect(kept.header("Location") == "/echo")
        #expect(kept.metrics.redirects == 0)
    }

    @Test("a redirect to a scheme other than http/https is refused")
    func redirectToOtherScheme() throws {
        let error = try #require(transport.perform(HTTPRequest(
            url: server.url("/redirect-to?url=ftp://127.0.0.1/file"))).error)
        #expect(error.kind == .network)
        #expect(error.curlCode == 1)  // CURLE_UNSUPPORTED_PROTOCOL
        #expect(error.message.contains("after 1 redirect, at ftp://127.0.0.1/file"), "\(error.message)")
    }

    // MARK: Size cap

    @Test("a body of exactly maxResponseBytes is delivered whole", arguments: [false, true])
    func sizeCapExact(chunked: Bool) throws {
        let response = try transport.perform(HTTPRequest(
            url: server.url("/bytes?n=100000\(chunked ? "&chunked=1" : "")"), maxResponseBytes: 100_000)).get()
        #expect(response.status == 200)
        #expect(response.body.count == 100_000)
        // The server's pattern: byte i is i % 251.
        #expect(response.body.indices.allSatisfy { response.body[$0] == UInt8($0 % 251) })
    }

    @Test("one byte over maxResponseBytes fails with .tooLarge", arguments: [false, true])
    func sizeCapExceeded(chunked: Bool) throws {
        let error = try #require(transport.perform(HTTPRequest(
            url: server.url("/bytes?n=100001\(chunked ? "&chunked=1" : "")"), maxResponseBytes: 100_000)).error)
        #expect(error.kind == .tooLarge)
        // Known length: refused from Content-Length at the first bytes; chunked:
        // stopped at the cap. Both by the write callback.
        #expect(error.curlCode == 23)
        #expect(error.message.contains("max_response_bytes (100000 bytes)"), "\(error.message)")
    }

    @Test("a huge body is cut off at the cap, not downloaded", arguments: [false, true])
    func sizeCapStopsEarly(chunked: Bool) throws {
        let error = try #require(transport.perform(HTTPRequest(
            url: server.url("/bytes?n=300000000\(chunked ? "&chunked=1" : "")"), timeoutMs: 60_000,
            maxResponseBytes: 1 << 20)).error)
        #expect(error.kind == .tooLarge)
    }

    @Test("HEAD of a body over the cap succeeds: no body is read")
    func sizeCapHead() throws {
        let response = try transport.perform(HTTPRequest(
            method: "HEAD", url: server.url("/bytes?n=20000000"), maxResponseBytes: 1000)).get()
        #expect(response.status == 200)
        #expect(response.header("Content-Length") == "20000000")
        #expect(response.body.isEmpty)
    }

    // MARK: Content encoding

    @Test("gzip is requested and decoded")
    func gzipDecoded() throws {
        let response = try transport.perform(HTTPRequest(url: server.url("/gzip"))).get()
        #expect(response.header("Content-Encoding") == "gzip")
        let json = try #require(TestJSON(parsing: response.body))
        #expect(json["items"] != nil)
        #expect(response.metrics.bytesReceived == response.body.count)

        let echo = try transport.perform(HTTPRequest(url: server.url("/echo"))).get()
        let acceptEncoding = try #require(TestJSON(parsing: echo.body)?["headers"]?["accept-encoding"]?.string)
        #expect(acceptEncoding.contains("gzip"))
    }

    @Test("acceptEncoding false: no Accept-Encoding, body left as sent")
    func gzipNotRequested() throws {
        let echo = try transport.perform(HTTPRequest(url: server.url("/echo"), acceptEncoding: false)).get()
        #expect(TestJSON(parsing: echo.body)?["headers"]?["accept-encoding"] == nil)
        let raw = try transport.perform(HTTPRequest(url: server.url("/gzip"), acceptEncoding: false)).get()
        #expect(Array(raw.body.prefix(2)) == [0x1f, 0x8b])
    }

    @Test("a corrupt gzip body fails with .badContentEncoding")
    func badGzip() throws {
        let error = try #require(transport.perform(HTTPRequest(url: server.url("/bad-gzip"))).error)
        #expect(error.kind == .badContentEncoding)
        #expect(error.curlCode == 61)
        // Bytes after a whole gzip body: libcurl says it could not write to
        // disk (curl error 23); the message says what it was.
        let trailing = try #require(transport.perform(HTTPRequest(url: server.url("/bad-gzip?trailing=1"))).error)
        #expect(trailing.kind == .badContentEncoding)
        #expect(trailing.message.hasPrefix("the body could not be decoded from its Content-Encoding \"gzip\""),
                "\(trailing.message)")
    }

    // MARK: Validation

    @Test("invalid requests complete with .invalidRequest, from the loop thread",
          arguments: [
              ("method with a space", HTTPRequest(method: "GE T", url: "http://127.0.0.1:1/")),
              ("empty method", HTTPRequest(method: "", url: "http://127.0.0.1:1/")),
              ("header name with a space", HTTPRequest(url: "http://127.0.0.1:1/", headers: [(name: "Bad Name", value: "x")])),
              ("CRLF in a header value", HTTPRequest(url: "http://127.0.0.1:1/", headers: [(name: "X", value: "a\r\nInjected: 1")])),
              ("HEAD with a body", HTTPRequest(method: "HEAD", url: "http://127.0.0.1:1/", body: [])),
              ("negative timeout", HTTPRequest(url: "http://127.0.0.1:1/", timeoutMs: -1)),
              ("empty URL", HTTPRequest(url: "")),
              ("space in URL", HTTPRequest(url: "http://127.0.0.1:1/a b")),
              ("ftp scheme", HTTPRequest(url: "ftp://127.0.0.1:1/file")),
              ("malformed IPv6 host", HTTPRequest(url: "http://[::1/")),
              ("no scheme", HTTPRequest(url: "not-a-url")),
          ])
    func invalidRequests(label: String, request: HTTPRequest) throws {
        let caller = pthread_self()
        let box = TestCollector<(TransportResult, pthread_t)>()
        _ = transport.start(request, progress: nil) { box.add(($0, pthread_self())) }
        let (result, thread) = try #require(box.waitFirst(timeout: 10))
        let error = try #require(result.error)
        #expect(error.kind == .invalidRequest, "\(error)")
        #expect(!error.message.isEmpty)
        #expect(pthread_equal(thread, caller) == 0)
    }
}
