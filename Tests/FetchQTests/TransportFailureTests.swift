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
}
