import Testing

@testable import FetchQ

/// Storing, freshness, revalidation and LRU eviction of the in-memory cache.
@Suite struct HTTPCacheTests {
    typealias Headers = [(name: String, value: String)]

    static let t0 = 1_700_000_000.0

    static func cache(_ maxBytes: Int = 1 << 20) -> HTTPCache {
        try! HTTPCache(maxBytes: maxBytes)
    }

    @discardableResult
    static func put(
        _ cache: HTTPCache, _ key: String, _ headers: Headers, status: Int = 200,
        body: String = "body", request: String? = nil, now: Double = t0
    ) -> Bool {
        cache.store(
            key, status: status, headers: headers, body: Array(body.utf8),
            requestCacheControl: request, now: now)
    }

    /// "fresh", "stale" or "miss".
    static func state(_ lookup: HTTPCache.Lookup) -> String {
        switch lookup {
        case .miss: "miss"
        case .fresh: "fresh"
        case .stale: "stale"
        }
    }

    static func state(_ cache: HTTPCache, _ key: String, at now: Double, request: String? = nil)
        -> String
    {
        state(cache.lookup(key, now: now, requestCacheControl: request))
    }

    static func names(_ headers: Headers) -> [String] { headers.map { "\($0.name): \($0.value)" } }

    /// Keys are the request's bytes: two header values that differ only in
    /// Unicode form ("\u{E9}" and "e\u{301}") are two requests a server may
    /// answer differently, so two entries (a `[String: …]` index made them one).
    @Test func keysDifferingOnlyInUnicodeFormAreTwoEntries() {
        let cache = Self.cache()
        let fresh: Headers = [("Cache-Control", "max-age=60")]
        let composed = HTTPCache.key(method: "GET", url: "http://h/", headers: [("X-Name", "\u{E9}")])
        let decomposed = HTTPCache.key(method: "GET", url: "http://h/", headers: [("X-Name", "e\u{301}")])
        #expect(Self.put(cache, composed, fresh, body: "composed"))
        #expect(Self.state(cache, decomposed, at: Self.t0) == "miss")
        #expect(Self.put(cache, decomposed, fresh, body: "decomposed"))
        guard case .fresh(let a) = cache.lookup(composed, now: Self.t0),
              case .fresh(let b) = cache.lookup(decomposed, now: Self.t0) else {
            Issue.record("both entries should be fresh")
            return
        }
        #expect(String(decoding: a.body, as: UTF8.self) == "composed")
        #expect(String(decoding: b.body, as: UTF8.self) == "decomposed")
    }

    // MARK: - Freshness

    @Test func maxAgeBoundary() {
        let cache = Self.cache()
        #expect(Self.put(cache, "k", [("Cache-Control", "max-age=60")]))
        #expect(Self.state(cache, "k", at: Self.t0) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 59.999) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 60) == "stale")
        #expect(Self.state(cache, "k", at: Self.t0 + 3600) == "stale")
        let entry = cache.lookup("k", now: Self.t0).entry!
        #expect(entry.storedAt == Self.t0)
        #expect(entry.freshUntil == Self.t0 + 60)
        #expect(entry.status == 200)
        #expect(entry.body == Array("body".utf8))
        #expect(entry.header("cache-control") == "max-age=60")
    }

    @Test func ageHeaderShortensFreshness() {
        let cache = Self.cache()
        Self.put(cache, "k", [("Cache-Control", "max-age=60"), ("Age", "50")])
        #expect(Self.state(cache, "k", at: Self.t0 + 9.5) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 10) == "stale")
        let entry = cache.lookup("k", now: Self.t0).entry!
        #expect(entry.initialAge == 50)
        #expect(entry.currentAge(at: Self.t0 + 5) == 55)
        // An invalid Age is ignored; only the first member of a list counts.
        Self.put(cache, "bad", [("Cache-Control", "max-age=60"), ("Age", "soon")])
        #expect(cache.lookup("bad", now: Self.t0).entry?.freshUntil == Self.t0 + 60)
        Self.put(cache, "list", [("Cache-Control", "max-age=60"), ("Age", "20, 40")])
        #expect(cache.lookup("list", now: Self.t0).entry?.freshUntil == Self.t0 + 40)
        // Older than its lifetime on arrival: stale at once, so only kept with a validator.
        #expect(!Self.put(cache, "old", [("Cache-Control", "max-age=60"), ("Age", "60")]))
    }

    @Test func expiresMinusDate() {
        let cache = Self.cache()
        let date = "Tue, 14 Nov 2023 22:13:20 GMT"  // t0 on the server's clock
        let expires = "Tue, 14 Nov 2023 22:15:20 GMT"  // + 120 s
        // The lifetime is Expires - Date, counted from when we received it (t0 + 1000 here:
        // the server's clock being off does not matter).
        #expect(Self.put(cache, "k", [("Date", date), ("Expires", expires)], now: Self.t0 + 1000))
        #expect(cache.lookup("k", now: Self.t0).entry?.freshUntil == Self.t0 + 1120)
        #expect(Self.state(cache, "k", at: Self.t0 + 1119) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 1120) == "stale")
        // Without Date: Expires - now.
        #expect(Self.put(cache, "nodate", [("Expires", expires)]))
        #expect(cache.lookup("nodate", now: Self.t0).entry?.freshUntil == Self.t0 + 120)
        // max-age wins over Expires.
        Self.put(
            cache, "both", [("Date", date), ("Expires", expires), ("Cache-Control", "max-age=5")])
        #expect(cache.lookup("both", now: Self.t0).entry?.freshUntil == Self.t0 + 5)
        // Expires before Date: stale; without a validator, not stored.
        #expect(!Self.put(cache, "past", [("Date", expires), ("Expires", date)]))
    }

    @Test func invalidExpiresMeansExpired() {
        let cache = Self.cache()
        #expect(!Self.put(cache, "k", [("Expires", "0")]))
        #expect(Self.state(cache, "k", at: Self.t0) == "miss")
        #expect(Self.put(cache, "v", [("Expires", "0"), ("ETag", "\"1\"")]))
        #expect(Self.state(cache, "v", at: Self.t0) == "stale")
    }

    @Test func withoutExplicitFreshnessOnlyWithAValidator() {
        let cache = Self.cache()
        #expect(!Self.put(cache, "plain", [("Content-Type", "text/plain")]))
        #expect(Self.put(cache, "etag", [("ETag", "\"a\"")]))
        #expect(Self.put(cache, "lm", [("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")]))
        #expect(Self.state(cache, "plain", at: Self.t0) == "miss")
        #expect(Self.state(cache, "etag", at: Self.t0) == "stale")
        #expect(Self.state(cache, "lm", at: Self.t0) == "stale")
        #expect(!Self.put(cache, "zero", [("Cache-Control", "max-age=0")]))
    }

    // MARK: - What is stored

    @Test func noStoreInResponseOrRequestIsNotStored() {
        let cache = Self.cache()
        #expect(!Self.put(cache, "r", [("Cache-Control", "max-age=60, no-store")]))
        #expect(
            !Self.put(cache, "r", [("Cache-Control", "max-age=60"), ("cache-control", "NO-STORE")]))
        #expect(!Self.put(cache, "q", [("Cache-Control", "max-age=60")], request: "no-store"))
        #expect(Self.state(cache, "r", at: Self.t0) == "miss")
        #expect(Self.state(cache, "q", at: Self.t0) == "miss")
        #expect(cache.statistics.entries == 0)
        // A no-store response replaces (removes) what was stored for the key.
        #expect(Self.put(cache, "x", [("Cache-Control", "max-age=60")]))
        #expect(!Self.put(cache, "x", [("Cache-Control", "no-store")]))
        #expect(Self.state(cache, "x", at: Self.t0) == "miss")
    }

    @Test func noCacheIsStoredButAlwaysStale() {
        let cache = Self.cache()
        #expect(
            Self.put(cache, "k", [("Cache-Control", "no-cache, max-age=600"), ("ETag", "\"v\"")]))
        #expect(Self.state(cache, "k", at: Self.t0) == "stale")
        #expect(Self.state(cache, "k", at: Self.t0 + 1) == "stale")
        #expect(cache.lookup("k", now: Self.t0).entry?.noCache == true)
        // Qualified no-cache counts as no-cache; without a validator it is not stored.
        #expect(!Self.put(cache, "q", [("Cache-Control", #"no-cache="Set-Cookie", max-age=600"#)]))
    }

    @Test func privateIsStoredAndSMaxAgeIgnored() {
        let cache = Self.cache()
        #expect(Self.put(cache, "p", [("Cache-Control", "private, max-age=60")]))
        #expect(Self.state(cache, "p", at: Self.t0 + 30) == "fresh")
        #expect(!Self.put(cache, "s", [("Cache-Control", "s-maxage=60")]))
        #expect(Self.put(cache, "m", [("Cache-Control", "must-revalidate, max-age=1")]))
        #expect(cache.lookup("m", now: Self.t0).entry?.mustRevalidate == true)
    }

    @Test func statuses() {
        let cache = Self.cache()
        let fresh: Headers = [("Cache-Control", "max-age=60")]
        for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
            #expect(Self.put(cache, "s\(status)", fresh, status: status), "\(status)")
        }
        for status in [201, 206, 302, 304, 307, 400, 429, 500, 503] {
            #expect(!Self.put(cache, "s\(status)", fresh, status: status), "\(status)")
        }
        #expect(cache.lookup("s404", now: Self.t0).entry?.status == 404)
        // A non-cacheable status leaves an existing entry alone (it may still serve).
        #expect(Self.put(cache, "k", fresh))
        #expect(!Self.put(cache, "k", fresh, status: 503))
        #expect(cache.lookup("k", now: Self.t0).entry?.status == 200)
    }

    @Test func varyStarIsNotStored() {
        let cache = Self.cache()
        #expect(!Self.put(cache, "k", [("Cache-Control", "max-age=60"), ("Vary", "Accept, *")]))
        #expect(
            Self.put(cache, "k", [("Cache-Control", "max-age=60"), ("Vary", "Accept-Encoding")]))
    }

    @Test func requestCacheControlOnLookup() {
        let cache = Self.cache()
        Self.put(cache, "k", [("Cache-Control", "max-age=600")])
        #expect(Self.state(cache, "k", at: Self.t0 + 10) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 10, request: "no-cache") == "stale")
        #expect(Self.state(cache, "k", at: Self.t0 + 10, request: "max-age=10") == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 10, request: "max-age=9") == "stale")
        #expect(Self.state(cache, "k", at: Self.t0 + 10, request: "max-stale=5") == "fresh")
    }

    @Test func storeReplacesAndRemoveRemoves() {
        let cache = Self.cache()
        Self.put(cache, "k", [("Cache-Control", "max-age=60")], body: "one")
        Self.put(cache, "k", [("Cache-Control", "max-age=60")], body: "two")
        #expect(cache.lookup("k", now: Self.t0).entry?.body == Array("two".utf8))
        #expect(cache.statistics.entries == 1)
        #expect(
            cache.statistics.bytes
                == HTTPCache.cost(
                    key: "k", headers: [("Cache-Control", "max-age=60")], body: Array("two".utf8)))
        cache.remove("k")
        #expect(Self.state(cache, "k", at: Self.t0) == "miss")
        #expect(cache.statistics.entries == 0)
        #expect(cache.statistics.bytes == 0)
        #expect(cache.statistics.evictions == 0)
    }

    @Test func statisticsCountHitsAndMisses() {
        let cache = Self.cache()
        Self.put(cache, "a", [("Cache-Control", "max-age=60")])
        _ = cache.lookup("a", now: Self.t0)
        _ = cache.lookup("a", now: Self.t0 + 100)  // stale: still a hit
        _ = cache.lookup("b", now: Self.t0)
        let stats = cache.statistics
        #expect(stats.hits == 2)
        #expect(stats.misses == 1)
        #expect(stats.entries == 1)
    }

    // MARK: - Revalidation

    @Test func conditionalHeaders() {
        let cache = Self.cache()
        Self.put(
            cache, "both",
            [("ETag", "W/\"x1\""), ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")])
        Self.put(cache, "etag", [("etag", "\"e\"")])
        Self.put(cache, "lm", [("Last-Modified", "Mon, 07 Nov 1994 08:49:37 GMT")])
        Self.put(cache, "none", [("Cache-Control", "max-age=5")])
        func conditional(_ key: String) -> [String] {
            Self.names(HTTPCache.conditionalHeaders(for: cache.lookup(key, now: Self.t0).entry!))
        }
        #expect(
            conditional("both") == [
                "If-None-Match: W/\"x1\"", "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT",
            ])
        #expect(conditional("etag") == ["If-None-Match: \"e\""])
        #expect(conditional("lm") == ["If-Modified-Since: Mon, 07 Nov 1994 08:49:37 GMT"])
        #expect(conditional("none") == [])
    }

    @Test func notModifiedRefreshExtendsFreshnessAndKeepsBody() {
        let cache = Self.cache()
        Self.put(
            cache, "k",
            [
                ("Content-Type", "application/json"), ("Cache-Control", "max-age=60"),
                ("ETag", "\"v1\""), ("Age", "10"), ("Content-Length", "13"),
            ],
            body: #"{"answer":42}"#)
        #expect(Self.state(cache, "k", at: Self.t0 + 100) == "stale")
        let refreshed = cache.refresh(
            "k",
            notModifiedHeaders: [
                ("cache-control", "max-age=30"), ("ETag", "\"v1\""), ("Content-Length", "0"),
                ("Date", "Tue, 14 Nov 2023 22:15:00 GMT"),
            ], now: Self.t0 + 100)
        #expect(refreshed?.body == Array(#"{"answer":42}"#.utf8))
        #expect(refreshed?.storedAt == Self.t0 + 100)
        #expect(refreshed?.freshUntil == Self.t0 + 130)
        #expect(refreshed?.initialAge == 0)  // the old Age described the old response
        #expect(
            Self.names(refreshed?.headers ?? []) == [
                "Content-Type: application/json", "Content-Length: 13", "cache-control: max-age=30",
                "ETag: \"v1\"", "Date: Tue, 14 Nov 2023 22:15:00 GMT",
            ])
        #expect(Self.state(cache, "k", at: Self.t0 + 129) == "fresh")
        #expect(Self.state(cache, "k", at: Self.t0 + 130) == "stale")
        #expect(cache.lookup("k", now: Self.t0 + 120).entry?.body == Array(#"{"answer":42}"#.utf8))
        #expect(cache.statistics.entries == 1)
    }

    @Test func refreshWithoutFreshnessKeepsTheOldDirectives() {
        let cache = Self.cache()
        Self.put(cache, "k", [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")])
        // A 304 with no Cache-Control: the stored max-age applies from the new time.
        let refreshed = cache.refresh(
            "k", notModifiedHeaders: [("ETag", "W/\"v1\"")], now: Self.t0 + 500)
        #expect(refreshed?.freshUntil == Self.t0 + 560)
        #expect(refreshed?.etag == "W/\"v1\"")
    }

    @Test func refreshOfMissingOrMismatchedEntry() {
        let cache = Self.cache()
        #expect(cache.refresh("nothing", notModifiedHeaders: [], now: Self.t0) == nil)
        Self.put(cache, "k", [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")])
        #expect(
            cache.refresh("k", notModifiedHeaders: [("ETag", "\"v2\"")], now: Self.t0 + 1) == nil)
        #expect(Self.state(cache, "k", at: Self.t0 + 1) == "miss")
        // A 304 saying no-store: the refreshed entry answers this request, but is not kept.
        Self.put(cache, "n", [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")], body: "kept")
        let once = cache.refresh(
            "n", notModifiedHeaders: [("Cache-Control", "no-store")], now: Self.t0 + 1)
        #expect(once?.body == Array("kept".utf8))
        #expect(Self.state(cache, "n", at: Self.t0 + 1) == "miss")
    }

    // MARK: - Size bound and LRU

    @Test func leastRecentlyUsedIsEvicted() {
        let headers: Headers = [("Cache-Control", "max-age=60")]
        let body = [UInt8](repeating: 7, count: 100)
        let each = HTTPCache.cost(key: "a", headers: headers, body: body)
        let cache = Self.cache(3 * each)
        for key in ["a", "b", "c"] {
            #expect(
                cache.store(
                    key, status: 200, headers: headers, body: body, requestCacheControl: nil,
                    now: Self.t0))
        }
        #expect(cache.statistics.bytes == 3 * each)
        #expect(cache.keysByRecency == ["c", "b", "a"])
        // Using "a" makes "b" the least recently used.
        #expect(Self.state(cache, "a", at: Self.t0) == "fresh")
        #expect(cache.keysByRecency == ["a", "c", "b"])
        #expect(
            cache.store(
                "d", status: 200, headers: headers, body: body, requestCacheControl: nil,
                now: Self.t0))
        #expect(Self.state(cache, "b", at: Self.t0) == "miss")
        #expect(cache.keysByRecency == ["d", "a", "c"])
        var stats = cache.statistics
        #expect(stats.evictions == 1)
        #expect(stats.entries == 3)
        #expect(stats.bytes == 3 * each)
        // A bigger entry evicts as many as it needs, oldest first.
        let big = [UInt8](repeating: 1, count: 100 + each)
        #expect(
            cache.store(
                "e", status: 200, headers: headers, body: big, requestCacheControl: nil,
                now: Self.t0))
        #expect(cache.keysByRecency == ["e", "d"])
        stats = cache.statistics
        #expect(stats.evictions == 3)
        #expect(stats.bytes <= 3 * each)
        // A refresh counts as a use too.
        _ = cache.refresh("d", notModifiedHeaders: [], now: Self.t0 + 1)
        #expect(cache.keysByRecency == ["d", "e"])
    }

    @Test func oversizeIsNotStored() {
        let headers: Headers = [("Cache-Control", "max-age=60")]
        let cache = Self.cache(1000)
        #expect(Self.put(cache, "small", headers))
        let exact = 1000 - HTTPCache.cost(key: "fits", headers: headers, body: [])
        #expect(
            cache.store(
                "fits", status: 200, headers: headers, body: [UInt8](repeating: 0, count: exact),
                requestCacheControl: nil, now: Self.t0))
        #expect(cache.statistics.bytes == 1000)
        #expect(cache.keysByRecency == ["fits"])  // "small" made room
        #expect(
            !cache.store(
                "huge", status: 200, headers: headers,
                body: [UInt8](repeating: 0, count: exact + 1), requestCacheControl: nil,
                now: Self.t0))
        // The refused one removed nothing (other than itself) and did not evict.
        #expect(cache.keysByRecency == ["fits"])
        #expect(cache.statistics.evictions == 1)
        let none = Self.cache(0)
        #expect(!Self.put(none, "k", headers))
        #expect(none.statistics.entries == 0)
    }

    @Test func keyHelper() {
        let a = HTTPCache.key(
            method: "GET", url: "http://h/x",
            headers: [("Accept", "a"), ("X-B", "1"), ("x-b", "2")])
        let b = HTTPCache.key(
            method: "GET", url: "http://h/x",
            headers: [("X-B", "1"), ("accept", "a"), ("x-b", "2")])
        let c = HTTPCache.key(
            method: "GET", url: "http://h/x",
            headers: [("x-b", "2"), ("X-B", "1"), ("Accept", "a")])
        #expect(a == b)
        #expect(a != c)  // the order of repeated fields matters
        #expect(a == "GET http://h/x\naccept: a\nx-b: 1\nx-b: 2")
    }

    @Test func negativeSizeIsInvalid() {
        let error = #expect(throws: FetchQError.self) { try HTTPCache(maxBytes: -1) }
        #expect(error?.status == .invalid)
    }

    /// `invalidate(url:)` removes the entries of that URL (whatever their
    /// request headers) and only those: not the entries of a longer URL it is
    /// a prefix of ("/item" is not "/items" nor "/item?page=2").
    @Test func invalidateRemovesOnlyTheEntriesOfItsURL() {
        let cache = Self.cache()
        let fresh: Headers = [("Cache-Control", "max-age=60")]
        let plain = HTTPCache.key(method: "GET", url: "http://h/item", headers: [])
        let withHeader = HTTPCache.key(method: "GET", url: "http://h/item", headers: [("Accept", "text/x")])
        let longer = HTTPCache.key(method: "GET", url: "http://h/items", headers: [])
        let query = HTTPCache.key(method: "GET", url: "http://h/item?page=2", headers: [])
        for key in [plain, withHeader, longer, query] { #expect(Self.put(cache, key, fresh)) }
        #expect(cache.invalidate(url: "http://h/item") == 2)
        #expect(Self.state(cache, plain, at: Self.t0) == "miss")
        #expect(Self.state(cache, withHeader, at: Self.t0) == "miss")
        #expect(Self.state(cache, longer, at: Self.t0) == "fresh")
        #expect(Self.state(cache, query, at: Self.t0) == "fresh")
    }
}
