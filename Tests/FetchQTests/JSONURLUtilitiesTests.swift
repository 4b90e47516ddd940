import Testing

@testable import FetchQ

@Suite struct JSONURLUtilitiesTests {
    @Test func percentEncodeKeepsOnlyUnreserved() {
        let unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
        #expect(URLUtilities.percentEncode(unreserved) == unreserved)
        #expect(URLUtilities.percentEncode("") == "")
        #expect(URLUtilities.percentEncode("a b") == "a%20b")
        #expect(URLUtilities.percentEncode("a+b") == "a%2Bb")
        #expect(URLUtilities.percentEncode("100%") == "100%25")
        #expect(
            URLUtilities.percentEncode(":/?#[]@!$&'()*+,;=")
                == "%3A%2F%3F%23%5B%5D%40%21%24%26%27%28%29%2A%2B%2C%3B%3D")
        #expect(URLUtilities.percentEncode("\"<>\\^`{|}") == "%22%3C%3E%5C%5E%60%7B%7C%7D")
        #expect(URLUtilities.percentEncode("\n\t\u{0}\u{7F}") == "%0A%09%00%7F")
    }

    @Test func percentEncodeUnicodeAsUTF8Bytes() {
        #expect(URLUtilities.percentEncode("é") == "%C3%A9")
        #expect(URLUtilities.percentEncode("e\u{301}") == "e%CC%81")  // not normalized
        #expect(URLUtilities.percentEncode("日本") == "%E6%97%A5%E6%9C%AC")
        #expect(URLUtilities.percentEncode("😀") == "%F0%9F%98%80")
        #expect(URLUtilities.percentEncode("café au lait") == "caf%C3%A9%20au%20lait")
    }

    @Test func expandTemplateReplacesEveryPlaceholder() throws {
        #expect(
            try URLUtilities.expandTemplate("https://api.test/search?q={query}", query: "swift nio")
                == "https://api.test/search?q=swift%20nio")
        #expect(
            try URLUtilities.expandTemplate("http://h/{query}/x?again={query}&z=1", query: "a/b&c")
                == "http://h/a%2Fb%26c/x?again=a%2Fb%26c&z=1")
        #expect(try URLUtilities.expandTemplate("{query}", query: "é") == "%C3%A9")
        #expect(try URLUtilities.expandTemplate("x{query}", query: "") == "x")
        // The query is inserted once per placeholder, never re-expanded.
        #expect(try URLUtilities.expandTemplate("{query}", query: "{query}") == "%7Bquery%7D")
        // Near misses stay as they are.
        #expect(
            try URLUtilities.expandTemplate("{{query}} {Query} {query", query: "q")
                == "{q} {Query} {query")
    }

    /// A query of dots alone in the path would be a dot-segment; elsewhere,
    /// and any other query, is encoded as before.
    @Test func expandTemplateWritesADotSegmentQueryEncodedInThePath() throws {
        let t = "http://h/api/{query}/p?q={query}#{query}"
        #expect(try URLUtilities.expandTemplate(t, query: "..") == "http://h/api/%2E%2E/p?q=..#..")
        #expect(try URLUtilities.expandTemplate(t, query: ".") == "http://h/api/%2E/p?q=.#.")
        #expect(try URLUtilities.expandTemplate(t, query: "...") == "http://h/api/%2E%2E%2E/p?q=...#...")
        #expect(try URLUtilities.expandTemplate(t, query: "a..") == "http://h/api/a../p?q=a..#a..")
        #expect(try URLUtilities.expandTemplate("http://h/{query}{query}", query: ".") == "http://h/%2E%2E")
    }

    @Test func theCacheFormLowersSchemeAndHostAndDropsTheFragment() {
        let cases: [(String, String)] = [
            ("HTTP://Example.COM:8080/Path/X?Q=A#Top", "http://example.com:8080/Path/X?Q=A"),
            ("http://127.0.0.1:1/inv#top", "http://127.0.0.1:1/inv"),
            ("https://Alice:PassWord@Host.Example/P", "https://Alice:PassWord@host.example/P"),
            ("http://[FE80::1]:80/A", "http://[fe80::1]/A"),
            ("HTTP://H?A=B", "http://h/?A=B"),
            ("http://h", "http://h/"),
            ("http://h:80/x", "http://h/x"),
            ("http://h:/x", "http://h/x"),
            ("https://H:?q", "https://h/?q"),
            ("http://[::1]:/x", "http://[::1]/x"),
            ("https://h:443", "https://h/"),
            ("http://h:443/x", "http://h:443/x"),
            ("https://h:80/x", "https://h:80/x"),
            ("http://[::1]:80/x", "http://[::1]/x"),
            ("http://[::1]/x", "http://[::1]/x"),
            ("http://u:80@h/x", "http://u:80@h/x"),
            ("http://h/a", "http://h/a"),
            ("not a url#x", "not a url"),
            ("mailto:X@Y", "mailto:X@Y"),
        ]
        for (url, form) in cases { #expect(URLUtilities.cacheForm(url) == form, "\(url)") }
        #expect(HTTPCache.key(method: "GET", url: "HTTP://H/x#f", headers: []) == HTTPCache.key(method: "GET", url: "http://h/x", headers: []))
        // (an empty path and a default port: the tenth review's check of its changes)
        #expect(HTTPCache.key(method: "GET", url: "http://h:80", headers: []) == HTTPCache.key(method: "GET", url: "http://h/", headers: []))
    }

    @Test func nonASCIIBytesArePercentEncodedAndPasswordsRedacted() {
        #expect(URLUtilities.encodingNonASCII("http://h/caf\u{e9}?q=\u{e9}&r=%c3%a9") == "http://h/caf%C3%A9?q=%C3%A9&r=%c3%a9")
        #expect(URLUtilities.encodingNonASCII("http://h/a?b") == "http://h/a?b")
        #expect(URLUtilities.redactingPassword("http://alice:s3cret@h:1/x?y=a:b@c") == "http://alice:***@h:1/x?y=a:b@c")
        // A user name without a password is often a token (the sixth review).
        #expect(URLUtilities.redactingPassword("https://ghp_T0KEN@h/x") == "https://***@h/x")
        #expect(URLUtilities.redactingPassword("https://T0KEN:@h/x") == "https://***@h/x")
        #expect(URLUtilities.redactingPassword("http://h/x?u=a:b@c") == "http://h/x?u=a:b@c")
        #expect(URLUtilities.redactingPassword("http://a:b:c@h/") == "http://a:***@h/")
        // Text a server may send as a Location, which browsers read as
        // userinfo too (the ninth review's review: shown as it was).
        #expect(URLUtilities.redactingPassword(#"http:\\bob:s3cr3t@127.0.0.1:1\x"#) == #"http:\\bob:***@127.0.0.1:1\x"#)
        #expect(URLUtilities.redactingPassword("http:bob:s3cr3t@h/x") == "http:bob:***@h/x")
        #expect(URLUtilities.redactingPassword("http:///bob:s3cr3t@h") == "http:///bob:***@h")
        #expect(URLUtilities.redactingPassword("mailto:T0KEN@h") == "mailto:***@h")
        #expect(URLUtilities.redactingPassword("/relative/a:b@c") == "/relative/a:b@c")
        #expect(URLUtilities.redactingPassword("http:\\h\\a:b@c") == "http:\\h\\a:b@c")
    }

    @Test func expandTemplateWithoutPlaceholderIsAnError() {
        let error = #expect(throws: URLTemplateError.self) {
            try URLUtilities.expandTemplate("https://api.test/search?q={q}", query: "x")
        }
        #expect(error?.template == "https://api.test/search?q={q}")
        #expect(error?.message == #"endpoint template "https://api.test/search?q={q}" has no {query} placeholder"#)
    }

    @Test func encodeQueryItems() {
        #expect(URLUtilities.encodeQueryItems([("a", "1"), ("b", "x y")]) == "a=1&b=x%20y")
        #expect(URLUtilities.encodeQueryItems([]) == "")
        #expect(URLUtilities.encodeQueryItems([("k=v", "a&b"), ("", "")]) == "k%3Dv=a%26b&=")
        #expect(URLUtilities.encodeQueryItems([("q", "日"), ("q", "+")]) == "q=%E6%97%A5&q=%2B")
    }

    @Test(arguments: [
        ("http://example.com/path", "example.com"),
        ("https://Example.COM", "example.com"),
        ("HTTPS://example.com:8443/x", "example.com:8443"),
        ("HtTp://example.com?q=1", "example.com"),
        ("http://example.com#frag", "example.com"),
        ("http://example.com:80/", "example.com"),
        ("https://example.com:443/", "example.com"),
        ("http://example.com:443/", "example.com:443"),
        ("https://example.com:80/", "example.com:80"),
        ("http://example.com:/", "example.com"),
        ("http://example.com:0080/", "example.com"),
        ("http://user:pw@Host.test:9000/a", "host.test:9000"),
        ("http://user@host.test", "host.test"),
        ("http://user:p%40ss@host.test/", "host.test"),
        ("http://[::1]:8080/x", "[::1]:8080"),
        ("http://[::1]/", "[::1]"),
        ("https://[2001:DB8::A]:443/", "[2001:db8::a]"),
        ("http://[::ffff:192.0.2.1]:81", "[::ffff:192.0.2.1]:81"),
        ("http://127.0.0.1:3000", "127.0.0.1:3000"),
        ("http://bücher.test/", "bücher.test"),
        ("http://host.test/a@b", "host.test"),
        ("http://host.test?x=@evil", "host.test"),
        // the port as written, or spelled plainly when it is not
        ("http://Host.test:9000", "host.test:9000"),
        ("http://host.test:09000/", "host.test:9000"),
        ("http://host.test:0/", "host.test:0"),
        ("http://host.test:00/", "host.test:0"),
        ("http://host.test:65535", "host.test:65535"),
        ("https://host.test:8443#f", "host.test:8443"),
        ("http://h:1", "h:1"),
        ("http://[::1]:0443/", "[::1]:443"),
        ("Http://a.b.c.d.e.f.g.h.test:1234/long/path?q", "a.b.c.d.e.f.g.h.test:1234"),
    ])
    func hostOfAcceptsHTTPURLs(url: String, expected: String) {
        #expect(URLUtilities.hostOf(url: url) == expected)
    }

    @Test(arguments: [
        "ftp://example.com/",
        "file:///etc/passwd",
        "mailto:a@b.test",
        "javascript:alert(1)",
        "example.com",
        "//example.com/",
        "http:example.com",
        "http:/example.com",
        "http://",
        "http:///path",
        "http://:80/",
        "http://user@/",
        "http://a@b@host.test/",
        "http://example.com:65536/",
        "http://example.com:8o/",
        "http://example.com:-1/",
        "http://exa mple.com/",
        "http://example.com\\@evil.test/",
        "http://[::1/",
        "http://[::1]x/",
        "http://[zz::1]/",
        "http://[]/",
        "http://[1.2.3.4]/",
        " http://example.com/",
        "",
        "httpx://example.com/",
        "htt://example.com/",
        "https:/",
        "http://host.test:99999999999999999999/",
    ])
    func hostOfRejectsEverythingElse(url: String) {
        #expect(URLUtilities.hostOf(url: url) == nil)
    }
}
