// What may be stored and for how long: pure functions of the response, no state, no lock.

extension HTTPCache {
    /// Statuses stored: those RFC 9110 §15.1 calls heuristically cacheable, minus 206
    /// (ranges are not supported). Any other status is never stored, even with explicit
    /// freshness — deliberately narrower than RFC 9111 §3 allows, so that for example a 503
    /// with `max-age` is never replayed instead of being retried.
    public static let cacheableStatuses: Set<Int> = [
        200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501,
    ]

    /// Fixed per-entry overhead counted by ``cost(key:headers:body:)``.
    public static let entryOverhead = 64

    /// What an entry counts toward `maxBytes`: the key, the body, each header as
    /// `name: value` plus 4 bytes of separators, and ``entryOverhead``.
    public static func cost(key: String, headers: [(name: String, value: String)], body: [UInt8])
        -> Int
    {
        var total = entryOverhead + key.utf8.count + body.count
        for header in headers { total += header.name.utf8.count + header.value.utf8.count + 4 }
        return total
    }

    /// A cache key naming a request: the method, the URL (scheme and host in lower case,
    /// no fragment: ``URLUtilities/cacheForm(_:)``), and every request header
    /// (names lowercased, sorted by name, the order of repeated names kept) but
    /// `Cache-Control` and `Pragma`.
    ///
    /// The cache does not implement `Vary` selection; it relies on the key instead: two
    /// requests with the same key must be answerable by the same stored response. Putting
    /// every request header in the key makes that hold for any `Vary` list. `Cache-Control`
    /// and `Pragma` are directives to the cache, not part of what is asked for: a
    /// `no-cache` request refreshes the entry plain requests use, not one of its own.
    public static func key(method: String, url: String, headers: [(name: String, value: String)])
        -> String
    {
        var lines: [(name: String, value: String, order: Int)] = []
        for (order, header) in headers.enumerated() {
            let name = lowercased(header.name)
            if name != "cache-control" && name != "pragma" { lines.append((name, header.value, order)) }
        }
        lines.sort { $0.name != $1.name ? $0.name < $1.name : $0.order < $1.order }
        var key = method + " " + URLUtilities.cacheForm(url)
        for line in lines { key += "\n" + line.name + ": " + line.value }
        return key
    }

    // MARK: - Storing

    enum StoreDecision {
        case store(Entry, cost: Int)
        /// Not stored. `dropExisting`: the response is a newer representation (a cacheable
        /// status), so an entry already stored for the key is obsolete and removed.
        case refuse(dropExisting: Bool)
    }

    /// Decides whether a response is stored, and computes its entry. The rules, in order:
    ///
    /// 1. The status must be in ``cacheableStatuses``; otherwise refused and an existing
    ///    entry is kept (the engine may still answer with it, RFC 9111 §4.2.4).
    /// 2. `no-store` in the request's or the response's `Cache-Control`: refused.
    /// 3. `Vary: *`: refused (such a response never matches a later request).
    /// 4. Freshness (``freshness(headers:now:)``). A response that is stale at once (no
    ///    explicit freshness, or `no-cache`) is stored only if it has a validator (`ETag` or
    ///    `Last-Modified`), because it is only useful for a conditional request.
    /// 5. A cost over `maxBytes`: refused.
    ///
    /// `private` and `public` do not matter (this is a private cache); `s-maxage` is ignored.
    /// Refusals from rules 2–5 remove an existing entry for the key.
    static func decide(
        key: String, status: Int, headers: [(name: String, value: String)], body: [UInt8],
        requestCacheControl: String?, now: Double, maxBytes: Int
    ) -> StoreDecision {
        guard cacheableStatuses.contains(status) else { return .refuse(dropExisting: false) }
        if let requestCacheControl, CacheControl(requestCacheControl).noStore {
            return .refuse(dropExisting: true)
        }
        let cacheControl = CacheControl(lines: values(named: "cache-control", in: headers))
        if cacheControl.noStore { return .refuse(dropExisting: true) }
        for vary in values(named: "vary", in: headers)
        where vary.split(separator: ",").contains(where: { $0.trimmingSpaces == "*" }) {
            return .refuse(dropExisting: true)
        }
        let entry = makeEntry(status: status, headers: headers, body: body, now: now)
        guard entry.isFresh(at: now) || entry.etag != nil || entry.lastModified != nil else {
            return .refuse(dropExisting: true)
        }
        let cost = cost(key: key, headers: headers, body: body)
        guard cost <= maxBytes else { return .refuse(dropExisting: true) }
        return .store(entry, cost: cost)
    }

    /// The entry for a response received at `now`.
    static func makeEntry(
        status: Int, headers: [(name: String, value: String)], body: [UInt8], now: Double
    ) -> Entry {
        let computed = freshness(headers: headers, now: now)
        let lifetime = computed.lifetime ?? 0
        return Entry(
            status: status, headers: headers, body: body, storedAt: now,
            initialAge: computed.initialAge,
            freshUntil: now + lifetime - computed.initialAge,
            etag: value(named: "etag", in: headers),
            lastModified: value(named: "last-modified", in: headers),
            noCache: computed.cacheControl.noCache,
            mustRevalidate: computed.cacheControl.mustRevalidate)
    }

    /// The freshness lifetime (RFC 9111 §4.2.1) and the age at reception (§4.2.3) of a
    /// response received at `now`.
    ///
    /// - lifetime: `max-age` if present (an invalid argument counts as 0), else
    ///   `Expires` − `Date` (`now` when `Date` is absent or invalid; an invalid `Expires`
    ///   such as `0` means already expired, lifetime 0), else nil: no explicit freshness,
    ///   and no heuristic freshness is computed. `s-maxage` is for shared caches: ignored.
    /// - initialAge: the `Age` header (its first member, a non-negative integer; ignored
    ///   when invalid, §5.1). The apparent age from `Date` is not used, so a server clock
    ///   that is off does not make every response stale.
    static func freshness(headers: [(name: String, value: String)], now: Double)
        -> (lifetime: Double?, initialAge: Double, cacheControl: CacheControl)
    {
        let cacheControl = CacheControl(lines: values(named: "cache-control", in: headers))
        var lifetime: Double?
        if let maxAge = cacheControl.maxAge {
            lifetime = Double(maxAge)
        } else if let expires = value(named: "expires", in: headers) {
            if let expiresAt = HTTPDate.parse(expires) {
                let date = value(named: "date", in: headers).flatMap(HTTPDate.parse) ?? now
                lifetime = expiresAt - date
            } else {
                lifetime = 0
            }
        }
        var initialAge = 0.0
        if let age = value(named: "age", in: headers) {
            let first = age.split(separator: ",", omittingEmptySubsequences: false).first ?? ""
            if let seconds = CacheControl.deltaSeconds(String(first.trimmingSpaces)) {
                initialAge = Double(seconds)
            }
        }
        return (lifetime, initialAge, cacheControl)
    }

    // MARK: - Revalidation

    /// Header fields a 304 never replaces in the stored response: framing and
    /// connection-specific fields (RFC 9111 §3.2 excludes `Content-Length`; the others
    /// describe one message, not the representation). `Content-Encoding` is kept because
    /// the stored body is the one the transport delivered.
    static let fieldsNotUpdated: Set<String> = [
        "content-length", "content-encoding", "transfer-encoding", "connection",
        "keep-alive", "te", "trailer", "upgrade", "proxy-connection",
    ]

    /// The stored headers updated with a 304's (RFC 9111 §3.2): every field the 304 carries
    /// (except ``fieldsNotUpdated``) replaces all stored lines of that name, in the 304's
    /// order, at the end. A stored `Age` is dropped: it described the old response.
    static func merge(
        stored: [(name: String, value: String)], notModified: [(name: String, value: String)]
    ) -> [(name: String, value: String)] {
        var replaced = Set<String>(["age"])
        for header in notModified {
            let name = lowercased(header.name)
            if !fieldsNotUpdated.contains(name) { replaced.insert(name) }
        }
        var merged = stored.filter { !replaced.contains(lowercased($0.name)) }
        merged.append(
            contentsOf: notModified.filter { !fieldsNotUpdated.contains(lowercased($0.name)) })
        return merged
    }

    /// False when both the stored entry and the 304 carry an entity tag and the tags differ
    /// (weak comparison, RFC 9110 §8.8.3.2): the 304 is about another representation
    /// (RFC 9111 §4.3.4), so the stored one must not be refreshed with it.
    static func validatorsMatch(stored: Entry, notModified: [(name: String, value: String)])
        -> Bool
    {
        guard let storedTag = stored.etag, let newTag = value(named: "etag", in: notModified)
        else { return true }
        return opaqueTag(storedTag) == opaqueTag(newTag)
    }

    private static func opaqueTag(_ tag: String) -> Substring {
        let trimmed = tag.trimmingSpaces
        return trimmed.hasPrefix("W/") ? trimmed.dropFirst(2) : trimmed
    }

    // MARK: - Header helpers

    /// The first value of the header `name` (lowercase), compared case-insensitively.
    static func value(named name: String, in headers: [(name: String, value: String)]) -> String? {
        headers.first { lowercased($0.name) == name }?.value
    }

    /// Every value of the header `name` (lowercase), in order.
    static func values(named name: String, in headers: [(name: String, value: String)])
        -> [String]
    {
        headers.compactMap { lowercased($0.name) == name ? $0.value : nil }
    }

    static func lowercased(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 >= 65 && $0 <= 90 }) else { return text }
        return String(
            decoding: text.utf8.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs.
    var trimmingSpaces: SubSequence {
        var slice = self[...]
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return slice
    }
}

extension HTTPCache.Entry {
    /// The entry as a transport response (no transfer metrics).
    func response(url: String) -> HTTPResponse {
        HTTPResponse(status: status, headers: headers, body: body, effectiveURL: url, metrics: TransferMetrics())
    }
}
