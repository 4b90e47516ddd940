import CCurl
@testable import FetchQ
import Glibc
import Testing

/// Every way a transfer can fail maps to the right TransportError.Kind.
@Suite("Transport: failures")
struct TransportFailureTests {
    let transport: CurlTransport

    init() throws {
        transport = try CurlTransport()
    }

    @Test("nothing listening: .connect")
    func connectionRefused() throws {
        let port = try closedLocalPort()
        let error = try #require(transport.perform(HTTPRequest(url: "http://127.0.0.1:\(port)/")).error)
        #expect(error.kind == .connect)
        #expect(error.curlCode == 7)
        #expect(error.message.contains("127.0.0.1 port \(port)"))  // curl's error buffer
        #expect(error.message.hasSuffix("(curl error 7)"))
    }

    @Test("a host that does not resolve: .resolve")
    func unresolvable() throws {
        let error = try #require(transport.perform(HTTPRequest(
            url: "http://no-such-host.invalid/", timeoutMs: 15_000)).error)
        #expect(error.kind == .resolve)
        #expect(error.curlCode == 6)
    }

    @Test("connect timeout: .timeout")
    func connectTimeout() throws {
        let blackhole = try BlackholeListener()
        let error = try #require(transport.perform(HTTPRequest(
            url: "http://127.0.0.1:\(blackhole.port)/", connectTimeoutMs: 300)).error)
        #expect(error.kind == .timeout)
        #expect(error.curlCode == 28)
        withExtendedLifetime(blackhole) {}
    }

    @Test("total timeout while the server delays or stalls: .timeout",
          arguments: ["/delay?ms=20000", "/stall", "/drip?bytes=100000&chunk=10&interval_ms=100"])
    func totalTimeout(path: String) throws {
        let server = try TestServer()
        let error = try #require(transport.perform(HTTPRequest(url: server.url(path), timeoutMs: 400)).error)
        #expect(error.kind == .timeout)
        #expect(error.curlCode == 28)
        #expect(error.message.contains("imed out"))  // curl: "Operation timed out after ..."
    }

    @Test("the connection breaks mid-response: .network",
          arguments: ["/close-mid-body?bytes=10000", "/reset", "/reset-after-headers",
                      "/wrong-length?declared=1000&actual=10"])
    func brokenResponses(path: String) throws {
        let server = try TestServer()
        let error = try #require(transport.perform(HTTPRequest(url: server.url(path))).error)
        #expect(error.kind == .network, "\(error)")
        // PARTIAL_FILE, GOT_NOTHING, RECV_ERROR
        #expect([18, 52, 56].contains(error.curlCode), "\(error)")
    }

    // MARK: TLS

    @Test("TLS: a self-signed certificate is refused by default")
    func tlsVerificationFails() throws {
        let server = try TestServer(tls: true)
        let error = try #require(transport.perform(HTTPRequest(url: server.url("/json?size=10"))).error)
        #expect(error.kind == .tls)
        #expect(error.curlCode == 60)  // PEER_FAILED_VERIFICATION
    }

    @Test("TLS: accepted with caFile, or with verification off")
    func tlsWithTrust() throws {
        let server = try TestServer(tls: true)
        let trusted = try transport.perform(HTTPRequest(
            url: server.url("/json?size=10"), caFile: server.certificateFile)).get()
        #expect(trusted.status == 200)
        #expect(trusted.effectiveURL.hasPrefix("https://"))
        let unverified = try transport.perform(HTTPRequest(url: server.url("/json?size=10"), verifyTLS: false)).get()
        #expect(unverified.status == 200)
    }

    @Test("TLS: a missing CA file fails with .tls")
    func tlsMissingCAFile() throws {
        let server = try TestServer(tls: true)
        let error = try #require(transport.perform(HTTPRequest(
            url: server.url("/json"), caFile: "/nonexistent/ca.pem")).error)
        #expect(error.kind == .tls, "\(error)")
        #expect(error.curlCode == 77)  // SSL_CACERT_BADFILE
    }

    /// A TLS handshake the peer reset or closed is a network failure (retried
    /// as one); a real TLS failure stays one, whatever errno an address tried
    /// before left (refinedKind reads curl's text, not CURLINFO_OS_ERRNO).
    @Test func tlsHandshakeResetsAreNetworkFailuresAndAlertsStayTLS() {
        let cases: [(String, TransportError.Kind)] = [
            ("Recv failure: Connection reset by peer", .network),
            ("OpenSSL SSL_connect: SSL_ERROR_SYSCALL in connection to 127.0.0.1:443 ", .network),
            ("error:0A000126:SSL routines::unexpected eof while reading", .network),
            ("error:0A000410:SSL routines::sslv3 alert handshake failure", .tls),
            ("error:0A00042E:SSL routines::tlsv1 alert protocol version", .tls),
        ]
        for (text, kind) in cases {
            #expect(TransportError.refinedKind(.tls, code: CURLE_SSL_CONNECT_ERROR, text: text) == kind, "\(text)")
        }
        #expect(TransportError.refinedKind(.network, code: CURLE_RECV_ERROR,
                                           text: "Too large response headers: 307794 > 307200") == .tooLarge)
        #expect(TransportError.refinedKind(.network, code: CURLE_RECV_ERROR, text: "Recv failure: Connection reset by peer")
                == .network)
    }

    /// Two Content-Lengths that differ (the route's own, and a "2" before
    /// it) are an unrecoverable framing error (RFC 9112 §6.3): the response
    /// is not used, whichever value libcurl would frame the body by.
    @Test("two different Content-Lengths: .network, the response is not used")
    func conflictingContentLengths() throws {
        let server = try TestServer()
        let spec = URLUtilities.percentEncode(#"200;Content-Length=2;body={"a":1}"#)
        let result = try transport.perform(HTTPRequest(url: server.url("/steps?key=cl&s=\(spec)")))
        let error = try #require(result.error, "\(String(describing: result.response?.body))")
        #expect(error.kind == .network, "\(error)")
        #expect(error.message.contains("two Content-Lengths"), "\(error.message)")
    }

    /// Trailer fields after a chunked body are not header fields (RFC 9110
    /// §6.5.1): a trailer cannot add a field, such as Cache-Control, to the
    /// response. (A canned response from a one-shot listener.)
    @Test("trailer fields are not merged into the headers")
    func trailerFieldsAreDropped() throws {
        let body = #"{"a":1}"#
        let canned = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            + "Connection: close\r\n\r\n" + String(body.utf8.count, radix: 16) + "\r\n" + body + "\r\n0\r\n"
            + "Cache-Control: max-age=3600\r\nX-Trailer: t\r\n\r\n"
        let server = try OneShotServer(canned)
        let response = try #require(transport.perform(HTTPRequest(url: "http://127.0.0.1:\(server.port)/t")).response)
        server.join()
        #expect(response.status == 200)
        #expect(String(decoding: response.body, as: UTF8.self) == body)
        #expect(response.header("cache-control") == nil)
        #expect(response.header("x-trailer") == nil)
        #expect(response.header("content-type") == "application/json")
    }

    /// A 304 is not a redirect, also with a Location: a POST (whose
    /// redirects fetchq follows itself) answered 304 gets that 304.
    @Test("a 304 with a Location is not followed")
    func a304WithALocationIsNotFollowed() throws {
        let server = try TestServer()
        let spec = URLUtilities.percentEncode("304;Location=/json")
        let response = try #require(transport.perform(HTTPRequest(
            method: "POST", url: server.url("/steps?key=nm&s=\(spec)"), body: Array("x".utf8))).response)
        #expect(response.status == 304)
        #expect(response.metrics.redirects == 0)
    }

    /// GET and HEAD, whose redirects libcurl follows: libcurl 7.88 followed
    /// a 304's Location too (the twelfth review); the 304 is the response,
    /// and nothing is asked of the Location.
    @Test(arguments: ["GET", "HEAD"])
    func a304WithALocationIsNotFollowedByLibcurl(method: String) throws {
        let server = try TestServer()
        let spec = URLUtilities.percentEncode("304;Location=/echo")
        let response = try #require(transport.perform(HTTPRequest(
            method: method, url: server.url("/steps?key=nm-\(method)&s=\(spec)"))).response)
        #expect(response.status == 304)
        #expect(response.metrics.redirects == 0)
        #expect(response.body.isEmpty)
        #expect(response.header("Location") == "/echo")
        let (_, stats) = try server.get("/stats")
        #expect(try JSONParser.parse(stats, maxDepth: 64).at("/by_path/~1echo") == nil)  // never asked
    }
}

/// A listener on 127.0.0.1 that answers one connection with canned bytes
/// (after reading the request head, at most 64 KiB), then closes it. Bounded:
/// the accept waits at most 10 s, each read 10 s.
final class OneShotServer: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private var thread: pthread_t?

    init(_ response: String) throws {
        listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw TestServer.Failure(description: "socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let fd = listener
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p -> Int32 in
                guard bind(fd, p, length) == 0, listen(fd, 1) == 0 else { return -1 }
                return getsockname(fd, p, &length)
            }
        }
        guard bound == 0 else {
            close(fd)
            throw TestServer.Failure(description: "bind/listen: errno \(errno)")
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        let bytes = Array(response.utf8)
        thread = try startThread(name: "one-shot") {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 10_000) == 1 else { return }
            let conn = accept(fd, nil, nil)
            guard conn >= 0 else { return }
            defer { close(conn) }
            var timeout = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var head: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while head.count < 65_536, !head.suffix(4).elementsEqual([13, 10, 13, 10]) {
                let n = recv(conn, &buffer, buffer.count, 0)
                guard n > 0 else { return }
                head += buffer[0..<n]
            }
            _ = bytes.withUnsafeBytes { send(conn, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
    }

    /// Waits for the answer to be sent (or the wait to give up).
    func join() {
        if let thread { joinThread(thread) }
        thread = nil
    }

    deinit {
        join()
        close(listener)
    }
}
