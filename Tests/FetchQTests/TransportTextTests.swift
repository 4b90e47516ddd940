@testable import FetchQ
import Testing

/// Byte-level text checks on the transport's hot path.
@Suite struct TransportTextTests {
    @Test func schemePrefixIgnoresASCIICase() {
        for url in ["http://a", "HTTP://a", "hTtP://", "http://é"] {
            #expect(CurlTransfer.hasScheme(url, "http://"), "\(url)")
            #expect(!CurlTransfer.hasScheme(url, "https://"), "\(url)")
        }
        for url in ["https://a", "HTTPS://x/y?z", "https://"] {
            #expect(CurlTransfer.hasScheme(url, "https://"), "\(url)")
            #expect(!CurlTransfer.hasScheme(url, "http://"), "\(url)")
        }
        for url in ["", "http:/", "htp://a", "ftp://a", " http://a", "httpé://", "http:\\\\a", "ｈttp://a"] {
            #expect(!CurlTransfer.hasScheme(url, "http://"), "\(url)")
            #expect(!CurlTransfer.hasScheme(url, "https://"), "\(url)")
        }
    }

    @Test func cachingHeaderNames() {
        for name in ["Cache-Control", "cache-control", "CACHE-CONTROL", "Expires", "expires", "EXPIRES"] {
            #expect(Engine.isCachingHeader(name), "\(name)")
        }
        for name in ["Cache-Controls", "Cache_Control", "Expire", "Last-Modified", "", "ＥXPIRES"] {
            #expect(!Engine.isCachingHeader(name), "\(name)")
        }
    }
}
