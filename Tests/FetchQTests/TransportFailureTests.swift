import FetchQ
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
}
