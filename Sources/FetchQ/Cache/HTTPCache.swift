import Glibc

/// The engine's HTTP response cache: a private cache (RFC 9111) held in memory, bounded in
/// bytes with least-recently-used eviction, optionally written through to an SQLite file so
/// that entries survive the process.
///
/// ## What the engine does with it
///
/// 1. ``lookup(_:now:requestCacheControl:)`` before sending a GET. `.fresh`: answer with
///    the entry, no request. `.stale`: send the request with
///    ``conditionalHeaders(for:)``. `.miss`: send it plain.
/// 2. A 304 to a conditional request: ``refresh(_:notModifiedHeaders:now:)`` and answer
///    with the entry it returns (nil: the entry is gone; send the request again without
///    validators). Any other response: ``store(_:status:headers:body:requestCacheControl:now:)``.
///
/// Keys come from the engine, e.g. ``key(method:url:headers:)``. The cache does not look at
/// methods or `Vary` lists (except `Vary: *`, never stored): two requests with the same key
/// must be answerable by the same response. Only responses to GET should be stored.
///
/// ## Freshness
///
/// See ``decide(key:status:headers:body:requestCacheControl:now:maxBytes:)`` and
/// ``freshness(headers:now:)``: `max-age`, else `Expires` − `Date`, minus `Age`; no
/// heuristic freshness. An entry is fresh while `now < freshUntil` and it is not
/// `no-cache`; otherwise a lookup reports it stale and the engine revalidates it. Stale
/// entries are never served without revalidation, so `must-revalidate` changes nothing
/// here; ``Entry/mustRevalidate`` tells the engine not to serve a stale entry when the
/// origin cannot be reached either. Times are wall-clock seconds since the epoch, passed in
/// by the caller (`now`), so tests control the clock.
///
/// ## Size bound
///
/// Every entry has a cost (``cost(key:headers:body:)``). The total cost of all entries —
/// those in memory and, with persistence, those still only in the file — never exceeds
/// `maxBytes` once a call returns: storing evicts least-recently-used entries first (an
/// entry is used when it is stored, refreshed, or found by a lookup). An entry that alone
/// costs more than `maxBytes` is not stored. All operations are O(1) apart from header
/// parsing and SQLite work.
///
/// ## Persistence
///
/// With `persistPath`, every change is written through to the table `fetchq_http_cache`
/// of that SQLite file (WAL, `synchronous=NORMAL`: a crash may lose the last writes, never
/// corrupt the file — acceptable for a cache). The file may be the item store's file: the
/// table is separate, and the file's `application_id` must be 0 or the item store's.
///
/// - Opening reads only the keys and sizes of the stored rows, newest first, keeps as many
///   as fit in `maxBytes` and deletes the others; the kept rows are "cold": counted toward
///   `maxBytes`, loaded on demand. The file therefore holds at most `maxBytes` too.
/// - A lookup that misses memory reads the file (a row written by an earlier instance, or
///   by another instance on the same file) and, if found, loads the entry into memory and
///   counts a hit.
/// - Evicted and removed entries are deleted from the file in the same transaction as the
///   store that evicted them. Cold rows are evicted before any entry in memory (nothing has
///   used them since the file was opened), oldest first.
/// - Recency in the file is the time of the last store, refresh or load; hits on an entry
///   already in memory are not written (no write per hit).
/// - SQLite failures do not fail the cache: the memory side keeps working and the error is
///   kept in ``persistenceError``. A row whose delete failed may stay in the file until the
///   next open trims it. Several instances on one file share the rows but not the
///   accounting: each bounds what it knows of, and opening trims the file again.
///
/// ## Concurrency
///
/// `Sendable`: one `Locked` (a pthread mutex) protects all mutable state: the
/// recency list with the entries, the cold index, the counters, the SQLite connection
/// (used only while holding it), and the last persistence error. Parsing headers and
/// computing freshness happen before the lock is taken; SQLite reads and writes happen
/// under it, so a store with persistence holds the lock for one small transaction.
public final class HTTPCache: Sendable {
    /// A stored response.
    public struct Entry: Sendable {
        public var status: Int
        /// As received (after a 304, merged with the 304's headers).
        public var headers: [(name: String, value: String)]
        public var body: [UInt8]
        /// When the response (or the 304 that last refreshed it) was received: wall-clock
        /// seconds since the epoch.
        public var storedAt: Double
        /// The `Age` the response carried when received, in seconds (0 without one).
        public var initialAge: Double
        /// The entry is fresh while `now < freshUntil` (and not ``noCache``). Without
        /// explicit freshness it equals ``storedAt``: stale at once.
        public var freshUntil: Double
        /// The `ETag` header, if any.
        public var etag: String?
        /// The `Last-Modified` header, if any.
        public var lastModified: String?
        /// `Cache-Control: no-cache`: stored, but every lookup reports it stale.
        public var noCache: Bool
        /// `Cache-Control: must-revalidate`: once stale, never use it without a successful
        /// revalidation, not even when the origin is unreachable.
        public var mustRevalidate: Bool

        public init(
            status: Int, headers: [(name: String, value: String)], body: [UInt8],
            storedAt: Double, initialAge: Double, freshUntil: Double, etag: String?,
            lastModified: String?, noCache: Bool, mustRevalidate: Bool
        ) {
            self.status = status
            self.headers = headers
            self.body = body
            self.storedAt = storedAt
            self.initialAge = initialAge
            self.freshUntil = freshUntil
            self.etag = etag
            self.lastModified = lastModified
            self.noCache = noCache
            self.mustRevalidate = mustRevalidate
        }

        /// The first header with this name, compared case-insensitively (ASCII).
        public func header(_ name: String) -> String? {
            HTTPCache.value(named: HTTPCache.lowercased(name), in: headers)
        }

        /// The age at `now` (RFC 9111 §4.2.3 without the apparent age): `Age` at reception
        /// plus the time resident. Never negative, also if the clock went back.
        public func currentAge(at now: Double) -> Double {
            initialAge + max(0, now - storedAt)
        }

        /// Fresh at `now`: usable without contacting the origin.
        public func isFresh(at now: Double) -> Bool {
            !noCache && now < freshUntil
        }
    }

    public enum Lookup: Sendable {
        case miss
        /// Usable as is.
        case fresh(Entry)
        /// Present, but must be revalidated first (expired, `no-cache`, or the request's
        /// `Cache-Control` asked for it).
        case stale(Entry)

        /// The entry, fresh or stale.
        public var entry: Entry? {
            switch self {
            case .miss: nil
            case .fresh(let entry), .stale(let entry): entry
            }
        }
    }

    /// The largest total cost held (see ``cost(key:headers:body:)``).
    public let maxBytes: Int
    /// The SQLite file, if persistent.
    public let persistPath: String?

    /// Everything mutable; only touched under `state`'s lock.
    struct State {
        var entries = RecencyList()
        var cold = ColdIndex()
        var connection: CacheConnection?
        var hits = 0
        var misses = 0
        var evictions = 0
        var persistenceError: FetchQError?
        /// The first failure of the current run of failed writes, until
        /// `takeUnreportedPersistenceError` takes it: one report per run.
        var unreportedPersistenceError: FetchQError?
        /// Since the last write that worked, writes have failed.
        var inFailedRun = false
        /// The file was deleted and a new one made at the path, until `takeReopened`
        /// reports it.
        var reopened = false
        /// The file was found replaced by another (reported once: see `record`).
        var replacedReported = false
        /// Keys removed here whose row the file could not delete (another
        /// writer held it): not loaded from the file again, and deleted at
        /// the next write that works. (The row came back at the next lookup,
        /// and answered after the POST that removed it: the tenth review.)
        var unwrittenDeletes = Set<ExactString>()

        var bytes: Int { entries.bytes + cold.bytes }
    }

    private let state: Locked<State>

    /// A cache holding at most `maxBytes` (≥ 0; 0 stores nothing).
    ///
    /// With `persistPath`, opens (creating if needed) that SQLite file in WAL mode with its
    /// own table, and picks up the entries an earlier instance left there, trimmed to
    /// `maxBytes`. Throws `.invalid` for a negative `maxBytes` or an empty path, `.store`
    /// when the file cannot be opened or used (not SQLite, another application's database,
    /// a `fetchq_http_cache` table with another layout, no WAL support).
    public init(maxBytes: Int, persistPath: String? = nil) throws(FetchQError) {
        guard maxBytes >= 0 else {
            throw FetchQError(.invalid, "http cache: maxBytes must be >= 0, got \(maxBytes)")
        }
        self.maxBytes = maxBytes
        self.persistPath = persistPath
        var initial = State()
        if let persistPath {
            guard !persistPath.isEmpty, !persistPath.utf8.contains(0) else {
                throw FetchQError(.invalid, "http cache: invalid persistPath")
            }
            let connection = try CacheConnection(path: persistPath)
            initial.cold = try connection.openIndex(maxBytes: maxBytes)
            initial.connection = connection
        }
        state = Locked(initial)
    }

    // MARK: - Lookup

    /// The entry for `key`, classified at `now`; counts a hit (fresh or stale) or a miss and
    /// makes the entry the most recently used. With persistence, a key not in memory is
    /// looked up in the file and loaded.
    ///
    /// `requestCacheControl` (the request's `Cache-Control`, optional) can only make a fresh
    /// entry stale: `no-cache` always does, `max-age=N` when the entry is older than N
    /// seconds. Other request directives are ignored.
    ///
    /// `now` is read after the entry was: one that another process wrote to the file in
    /// between (while this lookup waited for the lock, a writer holding it for up to the
    /// busy timeout) was stored at a time later than a clock read before, so an entry that
    /// was stale at once (`max-age=0`) looked fresh and was served without asking.
    public func lookup(_ key: String, now: @autoclosure () -> Double, requestCacheControl: String? = nil) -> Lookup {
        let found = state.withLock { state -> Entry? in
            if let slot = state.entries.slot(of: key) {
                state.entries.touch(slot)
                state.hits += 1
                return state.entries.entry(at: slot)
            }
            guard let entry = loadFromFile(key, &state) else {
                state.misses += 1
                return nil
            }
            state.hits += 1
            return entry
        }
        guard let entry = found else { return .miss }
        return Self.classify(entry, now: now(), requestCacheControl: requestCacheControl)
    }

    /// Whether a fresh entry for `key` is held now (see ``lookup(_:now:requestCacheControl:)``
    /// for what fresh means): a look, not a lookup. It counts nothing and leaves the recency
    /// order of what is in memory as it is; an entry only in the file (stored by an earlier
    /// instance, not read yet) is read into memory, as the lookup that follows would. `now`
    /// is read after the entry, as for a lookup.
    public func hasFresh(_ key: String, now: @autoclosure () -> Double, requestCacheControl: String? = nil) -> Bool {
        let found = state.withLock { state -> Entry? in
            if let slot = state.entries.slot(of: key) { return state.entries.entry(at: slot) }
            return state.cold.contains(key) ? loadFromFile(key, &state) : nil
        }
        guard let found, case .fresh = Self.classify(found, now: now(), requestCacheControl: requestCacheControl) else {
            return false
        }
        return true
    }

    /// Nothing is held, in memory or in the file (what ``hasFresh(_:now:requestCacheControl:)``
    /// looks at): a caller may skip making a key.
    public var holdsNothing: Bool { state.withLock { $0.entries.count == 0 && $0.cold.count == 0 } }

    private static func classify(_ entry: Entry, now: Double, requestCacheControl: String?) -> Lookup {
        guard entry.isFresh(at: now) else { return .stale(entry) }
        if let requestCacheControl {
            let directives = CacheControl(requestCacheControl)
            if directives.noCache { return .stale(entry) }
            if let maxAge = directives.maxAge, entry.currentAge(at: now) > Double(maxAge) {
                return .stale(entry)
            }
        }
        return .fresh(entry)
    }

    /// The validators to send when revalidating `entry`: `If-None-Match` with its entity
    /// tag, and `If-Modified-Since` with its `Last-Modified` (both when it has both; a
    /// server evaluates If-None-Match first, RFC 9110 §13.2.2). Empty without validators.
    public static func conditionalHeaders(for entry: Entry) -> [(name: String, value: String)] {
        var headers: [(name: String, value: String)] = []
        if let etag = entry.etag { headers.append(("If-None-Match", etag)) }
        if let lastModified = entry.lastModified {
            headers.append(("If-Modified-Since", lastModified))
        }
        return headers
    }

    // MARK: - Changes

    /// Stores the response for `key`, received at `now`, replacing any entry for it;
    /// returns whether it was stored. The rules are those of
    /// ``decide(key:status:headers:body:requestCacheControl:now:maxBytes:)``: a cacheable
    /// status, no `no-store` (request or response), no `Vary: *`, fresh or revalidatable,
    /// and not larger than `maxBytes`. A refused response with a cacheable status also
    /// removes the entry stored for `key` (it is outdated); other refusals leave it.
    @discardableResult
    public func store(
        _ key: String, status: Int, headers: [(name: String, value: String)], body: [UInt8],
        requestCacheControl: String?, now: Double
    ) -> Bool {
        let decision = Self.decide(
            key: key, status: status, headers: headers, body: body,
            requestCacheControl: requestCacheControl, now: now, maxBytes: maxBytes)
        switch decision {
        case .refuse(let dropExisting):
            if dropExisting { remove(key) }
            return false
        case .store(let entry, let cost):
            let row =
                persistPath == nil || !Self.mayPersist(key)
                ? nil : CacheConnection.Row(key: key, entry: entry, cost: cost)
            state.withLock { state in put(key, entry, cost: cost, row: row, &state) }
            return true
        }
    }

    /// Applies a 304 Not Modified for `key` received at `now`: its headers are merged into
    /// the entry (RFC 9111 §3.2, see ``merge(stored:notModified:)``), freshness is computed
    /// again from the merged headers with `now` as the new reception time, and the entry
    /// becomes the most recently used. Returns the refreshed entry (to answer the request
    /// with), or nil when there is no entry for `key` or its entity tag differs from the
    /// 304's (then the entry is removed: the engine should request without validators).
    ///
    /// If the merged headers say `no-store`, or the refreshed entry no longer fits, the
    /// refreshed entry is returned but not kept.
    ///
    /// `validated`: the entry the conditional request was made for. When the cache no
    /// longer holds one for `key` (evicted, or removed by an unsafe request meanwhile) and
    /// the 304 matches it, it answers the request, refreshed, without being stored again.
    public func refresh(
        _ key: String, notModifiedHeaders: [(name: String, value: String)], now: Double,
        validated: Entry? = nil
    ) -> Entry? {
        state.withLock { state -> Entry? in
            let stored: Entry
            if let slot = state.entries.slot(of: key) {
                stored = state.entries.entry(at: slot)
            } else if let loaded = loadFromFile(key, &state) {
                stored = loaded
            } else {
                guard let validated, Self.validatorsMatch(stored: validated, notModified: notModifiedHeaders)
                else { return nil }
                return Self.makeEntry(status: validated.status,
                                      headers: Self.merge(stored: validated.headers, notModified: notModifiedHeaders),
                                      body: validated.body, now: now)
            }
            guard Self.validatorsMatch(stored: stored, notModified: notModifiedHeaders) else {
                drop(key, &state)
                return nil
            }
            let headers = Self.merge(stored: stored.headers, notModified: notModifiedHeaders)
            let refreshed = Self.makeEntry(
                status: stored.status, headers: headers, body: stored.body, now: now)
            let cost = Self.cost(key: key, headers: headers, body: stored.body)
            let noStore = CacheControl(lines: Self.values(named: "cache-control", in: headers))
                .noStore
            if noStore || cost > maxBytes {
                drop(key, &state)
            } else {
                let row =
                    persistPath == nil || !Self.mayPersist(key)
                    ? nil : CacheConnection.Row(key: key, entry: refreshed, cost: cost)
                put(key, refreshed, cost: cost, row: row, &state)
            }
            return refreshed
        }
    }

    /// Removes the entry for `key` from memory and from the file. Not an eviction.
    public func remove(_ key: String) {
        state.withLock { state in drop(key, &state) }
    }

    /// Removes the entry for `key` if there is one (in memory or in the
    /// file's index): nothing is written otherwise.
    public func removeIfHeld(_ key: String) {
        state.withLock { state in
            if state.entries.slot(of: key) != nil || state.cold.contains(key) || fileHolds(key, &state) {
                drop(key, &state)
            }
        }
    }

    /// Whether the file has a row for `key` that this instance does not know
    /// of (another engine wrote it since this one opened the file: a lookup
    /// here would load it).
    private func fileHolds(_ key: String, _ state: inout State) -> Bool {
        guard state.connection != nil else { return false }
        var found = false
        // (Through `record`: a file deleted meanwhile is made again first,
        // where the other engine writes now.)
        record(&state) { (connection) throws(FetchQError) in found = try connection.read(key) != nil }
        return found
    }

    /// Removes every entry for `url`, whatever its request headers (keys made by ``key(method:url:headers:)``
    /// for a GET of `url`, with anything after): after an unsafe request to it succeeded,
    /// what is stored may no longer be what the server has (RFC 9111 §4.4). Returns how
    /// many were removed.
    @discardableResult
    public func invalidate(url: String) -> Int {
        let exact = "GET " + URLUtilities.cacheForm(url)
        let prefix = exact + "\n"
        return state.withLock { state in
            var matching = (state.entries.keys + state.cold.keys).filter {  // by bytes, as keys are compared
                $0.utf8.elementsEqual(exact.utf8) || $0.utf8.starts(with: prefix.utf8)
            }
            if state.connection != nil {
                // And rows another engine wrote to the file since this one
                // opened it: a lookup here would load them (the tenth review's
                // check of its changes). Through `record`: a file deleted
                // meanwhile is made again first, where the other engine
                // writes now.
                let known = Set(matching.map(ExactString.init))
                var inFile: [String] = []
                record(&state) { (connection) throws(FetchQError) in
                    inFile = try connection.keys(exact, orStartingWith: prefix)
                }
                matching += inFile.filter { !known.contains(ExactString($0)) }
            }
            for key in matching { drop(key, &state) }
            return matching.count
        }
    }

    /// Removes every entry (and, with persistence, every row of the table). The counters
    /// are kept.
    public func removeAll() {
        state.withLock { state in
            state.entries.removeAll()
            record(&state) { (connection) throws(FetchQError) in try connection.deleteAll() }
            state.cold = ColdIndex()  // after: a file opened again there brings its index
        }
    }

    // MARK: - Inspection

    /// `entries` and `bytes` count everything held (in memory and, with persistence, rows
    /// not loaded yet); `bytes` ≤ `maxBytes`. `hits`: lookups that found an entry, fresh or
    /// stale (from memory or the file); `misses`: the others; `evictions`: entries removed
    /// to make room (not replacements, refusals or ``remove(_:)``).
    public var statistics: (entries: Int, bytes: Int, hits: Int, misses: Int, evictions: Int) {
        state.withLock { state in
            (
                state.entries.count + state.cold.count, state.bytes, state.hits, state.misses,
                state.evictions
            )
        }
    }

    /// The last SQLite failure of a write-through or load (nil if none since opening).
    public var persistenceError: FetchQError? {
        state.withLock { $0.persistenceError }
    }

    /// The SQLite failure of a run of failed writes not reported yet, once (for the engine
    /// to log); a write that works ends the run.
    public func takeUnreportedPersistenceError() -> FetchQError? {
        state.withLock { state in state.unreportedPersistenceError.take() }
    }

    /// Whether the file was found deleted, and a new one made at the path, since the last
    /// call.
    public func takeReopened() -> Bool {
        state.withLock { state in
            defer { state.reopened = false }
            return state.reopened
        }
    }

    /// Whether an entry may be written to the file: not when its request
    /// carried credentials (Authorization, Proxy-Authorization, Cookie, or a
    /// password in the URL), which the key holds in clear. Such entries are
    /// kept in memory only.
    static func mayPersist(_ key: String) -> Bool {
        let head = key.prefix { $0 != "\n" }
        if let authority = head.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false).dropFirst(2).first,
           authority.contains("@") {
            return false
        }
        for line in key.split(separator: "\n") where line.hasPrefix(":proxy: ") && line.contains("@") {
            return false  // the proxy's URL holds a user (and password)
        }
        return !key.contains("\nauthorization: ") && !key.contains("\nproxy-authorization: ")
            && !key.contains("\ncookie: ")
    }

    /// Keys in memory from the most to the least recently used (tests, diagnostics).
    var keysByRecency: [String] {
        state.withLock { $0.entries.keysByRecency }
    }

    /// Internal consistency of the memory side and the size bound (tests).
    func consistencyProblems() -> [String] {
        state.withLock { state in
            var problems = state.entries.consistencyProblems()
            if state.bytes > maxBytes { problems.append("\(state.bytes) bytes > \(maxBytes)") }
            return problems
        }
    }

    // MARK: - Under the lock

    /// Inserts or replaces `key`, evicts until everything fits, and writes the row and the
    /// deletions in one transaction.
    private func put(
        _ key: String, _ entry: Entry, cost: Int, row: CacheConnection.Row?, _ state: inout State
    ) {
        var deleted: [String] = []
        state.cold.remove(key)
        if let slot = state.entries.slot(of: key) {
            state.entries.replace(at: slot, entry, cost: cost)
        } else {
            state.entries.insert(key, entry, cost: cost)
        }
        evict(keeping: key, &state, deleted: &deleted)
        if state.connection != nil {
            // An entry the file may not hold (`mayPersist`) still writes the
            // deletions of what it evicted, and removes an older row of its key.
            if row == nil { deleted.append(key) }
            // (Written now: the row goes in, not out, at the next write.)
            state.unwrittenDeletes.remove(ExactString(key))
            let written = record(&state) { (connection) throws(FetchQError) in
                try connection.write(row, deleting: deleted)
            }
            if !written {
                // The file keeps what it had: an older row of the key (the
                // entry here is newer) and the rows evicted here.
                for gone in deleted + [key] { state.unwrittenDeletes.insert(ExactString(gone)) }
            }
        }
    }

    /// Evicts cold rows (oldest first), then the least recently used entries in memory,
    /// until the total fits in `maxBytes`. Never evicts `keeping` (it fits alone).
    private func evict(keeping: String, _ state: inout State, deleted: inout [String]) {
        while state.bytes > maxBytes {
            if let oldest = state.cold.popOldest() {
                deleted.append(oldest.key)
            } else {
                let slot = state.entries.tail
                guard slot >= 0, state.entries.key(at: slot) != keeping else { break }
                deleted.append(state.entries.remove(at: slot).key)
            }
            state.evictions += 1
        }
    }

    private func drop(_ key: String, _ state: inout State) {
        if let slot = state.entries.slot(of: key) { state.entries.remove(at: slot) }
        state.cold.remove(key)
        let written = record(&state) { (connection) throws(FetchQError) in try connection.write(nil, deleting: [key]) }
        if !written { state.unwrittenDeletes.insert(ExactString(key)) }
    }

    /// The entry for `key` read from the file, now held in memory as the most recently
    /// used (evicting others if needed); nil if there is no such row or no file. A row
    /// that cannot be decoded is deleted.
    private func loadFromFile(_ key: String, _ state: inout State) -> Entry? {
        guard let connection = state.connection else { return nil }
        if !state.unwrittenDeletes.isEmpty && state.unwrittenDeletes.contains(ExactString(key)) { return nil }
        let read: CacheConnection.Row?
        do {
            read = try connection.read(key)
        } catch {
            state.persistenceError = error
            return nil
        }
        guard let row = read else {
            state.cold.remove(key)  // deleted by another instance
            return nil
        }
        guard let entry = row.entry else {
            drop(key, &state)
            return nil
        }
        state.cold.remove(key)
        if row.cost <= maxBytes {
            state.entries.insert(key, entry, cost: row.cost)
            var deleted: [String] = []
            evict(keeping: key, &state, deleted: &deleted)
            record(&state) { (connection) throws(FetchQError) in
                try connection.touch(key, deleting: deleted)
            }
        }
        return entry
    }

    /// Runs a write on the file, keeping its error instead of failing the cache. A file
    /// deleted since it was opened (the path names none now) is made again at its path
    /// first: what is written to the old one would be lost with it. What the old file held
    /// is not written again (a file deleted to clear the cache stays cleared); the entries
    /// in memory stay. A file replaced by another one is not followed: the `-wal` and
    /// `-shm` files at the path may be the old file's or the new one's, and a connection
    /// opened there would read the old log over the new file (SQLite's own warning about
    /// files renamed while open); writes go on to the file opened, and a warning says so.
    /// Runs a write on the file (none without one: true); false when it
    /// failed (`persistenceError` says why). After one that worked, the
    /// deletes that could not be written before are tried again.
    @discardableResult
    private func record(_ state: inout State, _ body: (CacheConnection) throws(FetchQError) -> Void) -> Bool {
        guard var connection = state.connection else { return true }
        do {
            switch connection.fileState {
            case .same:
                break
            case .deleted:
                // Closed first; a moved or deleted file's log is not checkpointed or removed
                // by SQLite, so what is left beside the path is the old file's: removed, or
                // a new file there would get the old rows back from it.
                connection.close()
                unlink(connection.path + "-wal")
                unlink(connection.path + "-shm")
                let reopened = try CacheConnection(path: connection.path)
                state.cold = try reopened.openIndex(maxBytes: maxBytes)
                state.connection = reopened
                state.reopened = true
                connection = reopened
            case .replaced:
                if !state.replacedReported {
                    state.replacedReported = true
                    state.unreportedPersistenceError = FetchQError(
                        .store, "http cache \(JSONPointer.quoted(connection.path)): the file was replaced by another "
                            + "while open; entries go on to the file this engine opened, not to the new one")
                }
            }
            try body(connection)
            state.inFailedRun = false
            if !state.unwrittenDeletes.isEmpty {
                do throws(FetchQError) {
                    try connection.write(nil, deleting: state.unwrittenDeletes.map(\.value))
                    state.unwrittenDeletes.removeAll()
                } catch {
                    state.persistenceError = error  // tried again at the next write
                }
            }
            return true
        } catch {
            state.persistenceError = error
            if !state.inFailedRun {
                state.inFailedRun = true
                state.unreportedPersistenceError = error
            }
            return false
        }
    }
}
