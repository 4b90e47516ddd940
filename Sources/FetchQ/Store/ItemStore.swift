import CJansson
import CSQLite
import Glibc

/// A persistent store of JSON items keyed by (collection, id), kept in an SQLite file.
///
/// The search option `"store"` upserts the items extracted from each response here, in
/// one transaction per response; the C API reads them back.
///
/// ## Storage
///
/// One table, `items(collection, id, doc, updated_at)`, primary key `(collection, id)`,
/// `WITHOUT ROWID`. `id` is the item's id as canonical JSON (compact, keys sorted: the
/// string id `q-1` is stored as `"q-1"` with its quotes, the number 1 as `1`, so they are
/// different ids; the same identity rule as ``JSONSearch/dedupe(_:idPointer:)``). `doc` is
/// the whole item in the same canonical form, so documents come back with their object
/// keys sorted. `updated_at` is the time of the last insert or change, in milliseconds
/// since the Unix epoch. `PRAGMA application_id` marks the file (0x66716973, "fqis") and
/// `PRAGMA user_version` holds the schema version (1).
///
/// ## Durability
///
/// `journal_mode=WAL` with `synchronous=FULL`: a commit is on disk (log fsynced) when
/// ``upsert(collection:items:idPointer:merge:)`` returns, and a crash of the process, the
/// OS or the power mid-transaction loses nothing committed and keeps nothing of the
/// interrupted transaction.
///
/// ## Concurrency
///
/// Each instance has **one** SQLite connection, and a mutex serializes every use of it:
/// writers from many worker threads queue on the mutex, and each upsert is one
/// `BEGIN IMMEDIATE … COMMIT` transaction, so no write can be lost or interleaved. (A
/// connection per thread would not write faster: SQLite allows one writer per file
/// anyway.) Turning items into canonical JSON, and parsing documents read back, happen
/// outside the mutex, so only SQLite's own work is serialized.
///
/// Several connections to one file (two instances made with ``init(path:)``, or other
/// processes) coordinate through SQLite's file locks: a 5 s busy timeout waits for the
/// other writer, and a transaction still refused as busy is rolled back and retried (3
/// attempts) before ``upsert(collection:items:idPointer:merge:)`` throws; a write is never
/// dropped silently. Use ``shared(path:)`` so that all operations writing one file share one
/// instance.
///
/// `Sendable`: the connection lives inside a `Locked` (a pthread mutex), everything
/// else is immutable.
public final class ItemStore: Sendable {
    /// How an upsert treats an id that is already stored.
    public enum Merge: String, Sendable, CaseIterable {
        /// The new item replaces the stored document (server data wins).
        case overwrite = "overwrite"
        /// The stored document is kept; only new ids are inserted.
        case keepLocal = "keep-local"
    }

    /// What one upsert did. `inserted + updated + unchanged + skipped` is the number of
    /// items given.
    public struct UpsertReport: Sendable, Equatable, CustomStringConvertible {
        /// Items whose id was not stored before.
        public var inserted: Int
        /// Items that replaced a stored document with different content (overwrite only).
        public var updated: Int
        /// Items whose id was stored and whose stored document was left as it was: the same
        /// canonical JSON (overwrite), or any stored id (keep-local).
        public var unchanged: Int
        /// Items without an id (the id pointer selects nothing or `null`); not stored.
        public var skipped: Int

        public init(inserted: Int = 0, updated: Int = 0, unchanged: Int = 0, skipped: Int = 0) {
            self.inserted = inserted
            self.updated = updated
            self.unchanged = unchanged
            self.skipped = skipped
        }

        /// `{"inserted":…,"updated":…,"unchanged":…,"skipped":…}` as a new JSON object.
        public func json() -> JSONRef {
            let object = JSONRef.object()
            object.set("inserted", .integer(Int64(inserted)))
            object.set("updated", .integer(Int64(updated)))
            object.set("unchanged", .integer(Int64(unchanged)))
            object.set("skipped", .integer(Int64(skipped)))
            return object
        }

        public var description: String {
            "inserted \(inserted), updated \(updated), unchanged \(unchanged), skipped \(skipped)"
        }
    }

    /// The path the store was opened with (canonical for ``shared(path:)`` instances).
    public let path: String

    /// The connection (nil once closed). The mutex guards the connection, its cached
    /// statements and its test hook; nothing else in the instance is mutable.
    private let connection: Locked<StoreConnection?>

    /// The key under which ``shared(path:)`` registered this instance, if it did.
    private let registryKey: String?

    /// The file this instance opened (device, inode), to tell when the path
    /// names another file since (deleted, or replaced): nil if unknown.
    private let file: FileIdentity?

    struct FileIdentity: Equatable, Sendable {
        let device: UInt64
        let inode: UInt64

        /// The file `path` names now, or nil (none, or stat failed).
        init?(path: String) {
            var info = stat()
            guard stat(path, &info) == 0 else { return nil }
            device = UInt64(info.st_dev)
            inode = UInt64(info.st_ino)
        }
    }

    /// Opens the store at `path`, creating the file and the schema if needed.
    ///
    /// Throws `.invalid` for an empty path and `.store` when the file cannot be opened,
    /// is not an SQLite database, belongs to another application, has a newer schema, or
    /// cannot use write-ahead logging (e.g. `:memory:`).
    public convenience init(path: String) throws(FetchQError) {
        try self.init(path: path, registryKey: nil, busyTimeoutMilliseconds: 5000)
    }

    init(path: String, registryKey: String?, busyTimeoutMilliseconds: Int32) throws(FetchQError) {
        guard !path.isEmpty else {
            throw FetchQError(.invalid, "item store: the path is empty")
        }
        guard !path.utf8.contains(0) else {
            throw FetchQError(.invalid, "item store: the path contains a NUL character")
        }
        let opened: StoreConnection
        do {
            opened = try StoreConnection(
                path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds)
        } catch {
            throw error.error
        }
        self.path = path
        self.registryKey = registryKey
        self.connection = Locked(opened)
        self.file = FileIdentity(path: path)
    }

    /// Closes the connection (idempotent). Later calls on this instance throw `.state`.
    /// A ``shared(path:)`` instance is also removed from the registry, so the next
    /// `shared(path:)` opens a new one; other holders of this instance see it closed, so
    /// only the owner of the registry's users should close a shared store. Dropping the
    /// last reference closes the store too.
    public func close() {
        let closing = connection.withLock { connection -> StoreConnection? in
            let taken = connection
            connection = nil
            return taken
        }
        closing?.close()
        if let registryKey {
            Self.registry.withLock { entries in
                if entries[ExactString(registryKey)]?.store === self { entries[ExactString(registryKey)] = nil }
            }
        }
    }

    /// True after ``close()``.
    public var isClosed: Bool {
        connection.withLock { $0 == nil }
    }

    // MARK: - Writing

    /// Inserts or updates the items of `items` (a JSON array of objects) by their id, in
    /// one transaction: all of them are stored or, on any error, none.
    ///
    /// - Items are applied in array order, as if upserted one by one, so an id repeated in
    ///   one batch counts once as inserted and then as updated/unchanged.
    /// - An item's id is the value `idPointer` selects in it, compared as canonical JSON.
    ///   Items where it selects nothing or `null` are not stored and counted as `skipped`.
    /// - `merge` decides what happens to an id that is already stored (see ``Merge``).
    ///
    /// Throws `.invalid` (nothing written) if `collection` is empty, `items` is not an
    /// array or one of its elements is not an object or would not read back (a member
    /// name with a NUL byte, nesting deeper than jansson's 2048); `.store` for SQLite failures,
    /// including a write lock held by another connection for longer than the busy timeout
    /// (after retries); `.state` if the store is closed.
    public func upsert(
        collection: String, items: JSONRef, idPointer: JSONPointer, merge: Merge
    ) throws(FetchQError) -> UpsertReport {
        try Self.check(collection: collection)
        guard items.isArray else {
            throw FetchQError(
                .invalid,
                "item store: items must be a JSON array, got \(JSONSearch.typeName(items.type))")
        }
        // Canonical forms are computed before taking the lock.
        var rows: [(id: [UInt8], doc: [UInt8])] = []
        var skipped = 0
        try withExtendedLifetime(items) { () throws(FetchQError) in
            let count = json_array_size(items.pointer)
            rows.reserveCapacity(count)
            for index in 0..<count {
                let item = json_array_get(items.pointer, index)!
                guard jsonType(of: item) == JSON_OBJECT else {
                    throw FetchQError(
                        .invalid,
                        "item store: item \(index) is \(JSONSearch.typeName(jsonType(of: item))), "
                            + "not an object")
                }
                guard let id = idPointer.resolve(in: item), jsonType(of: id) != JSON_NULL else {
                    skipped += 1
                    continue
                }
                guard let idText = Self.canonical(id), let doc = Self.canonical(item) else {
                    throw FetchQError(
                        .invalid, "item store: item \(index) cannot be encoded as JSON")
                }
                // What is written must read back: jansson encodes a member
                // name with a NUL byte and any depth, which reading refuses
                // (one such item made its whole collection unreadable: the
                // tenth review).
                if !JSONParser.isValid(doc, maxDepth: JSONParser.janssonMaxDepth) {
                    var reason = "it would not read back"
                    do throws(JSONParseError) { _ = try JSONParser.parse(doc, maxDepth: JSONParser.janssonMaxDepth) } catch {
                        reason += " (\(error.message))"
                    }
                    throw FetchQError(.invalid, "item store: item \(index) cannot be stored: \(reason)")
                }
                rows.append((idText, doc))
            }
        }
        let timestamp = Self.nowMilliseconds()
        let counts = try withConnection { (db) throws(StoreFailure) in
            try db.upsert(collection: collection, rows: rows, merge: merge, timestamp: timestamp)
        }
        return UpsertReport(
            inserted: counts.inserted, updated: counts.updated, unchanged: counts.unchanged,
            skipped: skipped)
    }

    // MARK: - Reading

    /// All items of `collection` as a new JSON array.
    ///
    /// Ordered by the value `sortedBy` selects in each item, or without it by the item's
    /// id, with the rules of ``JSONSearch/sortItems(_:by:descending:)`` (numbers
    /// numerically, strings by bytes so ISO-8601 dates chronologically, items without the
    /// field last in both directions, ties in the order of the canonical id texts' bytes).
    /// An unknown collection gives an empty array.
    public func items(
        collection: String, sortedBy: JSONPointer? = nil, descending: Bool = false
    ) throws(FetchQError) -> JSONRef {
        try Self.check(collection: collection)
        let rows = try withConnection { (db) throws(StoreFailure) in
            try db.documents(collection: collection)
        }
        let array = JSONRef.array()
        guard let sortedBy else {
            // By id: the ids as values, ordered like a search's sort key.
            let ids = try rows.map { (row) throws(FetchQError) in try parse(row.id) }
            let order = withExtendedLifetime(ids) {
                JSONSearch.sortOrder(ids.map { Optional($0.pointer) }, descending: descending)
            }
            for i in order { array.append(try parse(rows[i].doc)) }
            return array
        }
        for row in rows { array.append(try parse(row.doc)) }
        do {
            return try JSONSearch.sortItems(array, by: sortedBy, descending: descending)
        } catch {
            throw FetchQError(.store, "item store: \(error.message)")  // unreachable: an array
        }
    }

    /// The item of `collection` whose id is `id` (compared as canonical JSON), as a new
    /// value, or nil. A `null` id is never stored, so it finds nothing.
    public func item(collection: String, id: JSONRef) throws(FetchQError) -> JSONRef? {
        try Self.check(collection: collection)
        guard !id.isNull, let idText = Self.canonical(id.pointer) else { return nil }
        return try item(collection: collection, canonicalID: idText)
    }

    /// The item of `collection` whose id is the JSON **string** `id` (as C passes a
    /// `const char *`), or nil. For a numeric id pass a JSON integer to the `JSONRef`
    /// overload.
    public func item(collection: String, id: String) throws(FetchQError) -> JSONRef? {
        try item(collection: collection, id: JSONRef.string(id))
    }

    /// The number of items in `collection` (0 for an unknown collection).
    public func count(collection: String) throws(FetchQError) -> Int {
        try Self.check(collection: collection)
        return try withConnection { (db) throws(StoreFailure) in
            try db.count(collection: collection)
        }
    }

    private func item(collection: String, canonicalID: [UInt8]) throws(FetchQError) -> JSONRef? {
        let doc = try withConnection { (db) throws(StoreFailure) in
            try db.document(collection: collection, id: canonicalID)
        }
        return try doc.map { (doc) throws(FetchQError) in try parse(doc) }
    }

    // MARK: - Shared instances

    private struct WeakStore {
        weak var store: ItemStore?
    }

    /// Canonical path -> the live shared instance for it.
    private static let registry = Locked<[ExactString: WeakStore]>([:])  // paths are bytes

    /// The process-wide instance for the file at `path`, opening it on first use.
    ///
    /// Paths that name the same file (relative or absolute, through symbolic links) give the
    /// same instance: the key is the `realpath` of the file, or of its directory when the
    /// file does not exist yet. The registry holds instances weakly: an instance stays
    /// shared while someone holds it (the engine, for its lifetime), and is closed when the
    /// last holder drops it. When the file at `path` is no longer the one the instance
    /// opened (it was deleted, or replaced by another), a new instance opens what is there
    /// now (creating it if needed); holders of the old one keep it. Throws like
    /// ``init(path:)``, and `.store` if the directory does not exist.
    public static func shared(path: String) throws(FetchQError) -> ItemStore {
        let key = try canonicalPath(path)
        return try registry.withLock { (entries) throws(FetchQError) -> ItemStore in
            if let existing = entries[ExactString(key)]?.store, !existing.isClosed,
               let opened = existing.file, opened == FileIdentity(path: key) {
                return existing
            }
            // Opening under the registry lock makes "one instance per file" exact.
            let store = try ItemStore(path: key, registryKey: key, busyTimeoutMilliseconds: 5000)
            entries = entries.filter { $0.value.store != nil }
            entries[ExactString(key)] = WeakStore(store: store)
            return store
        }
    }

    /// `realpath(path)`, or `realpath(directory)/name` for a file that does not exist yet.
    static func canonicalPath(_ path: String) throws(FetchQError) -> String {
        guard !path.isEmpty, !path.utf8.contains(0) else {
            throw FetchQError(.invalid, "item store: invalid path \(JSONPointer.quoted(path))")
        }
        if let resolved = realpath(path, nil) {
            defer { free(resolved) }
            return String(cString: resolved)
        }
        let bytes = Array(path.utf8)
        let slash = bytes.lastIndex(of: UInt8(ascii: "/"))
        let name = String(decoding: bytes[(slash.map { $0 + 1 } ?? 0)...], as: UTF8.self)
        let directory =
            slash.map { $0 == 0 ? "/" : String(decoding: bytes[..<$0], as: UTF8.self) } ?? "."
        guard !name.isEmpty, name != ".", name != ".." else {
            throw FetchQError(.invalid, "item store: \(JSONPointer.quoted(path)) names a directory")
        }
        guard let resolved = realpath(directory, nil) else {
            let reason = String(cString: strerror(errno))
            throw FetchQError(
                .store,
                "item store: directory \(JSONPointer.quoted(directory)) of "
                    + "\(JSONPointer.quoted(path)): \(reason)")
        }
        defer { free(resolved) }
        let base = String(cString: resolved)
        return base == "/" ? "/" + name : base + "/" + name
    }

    // MARK: - Testing

    /// Installs a hook called inside the write transaction after each item is written
    /// (with the item's index among the stored rows); throwing from it aborts the upsert.
    func setAfterWriteHookForTesting(_ hook: (@Sendable (Int) throws(FetchQError) -> Void)?) {
        connection.withLock { $0?.afterWriteHook = hook }
    }

    // MARK: - Helpers

    /// Runs `body` with the open connection while holding the lock.
    private func withConnection<R: Sendable>(
        _ body: (StoreConnection) throws(StoreFailure) -> R
    ) throws(FetchQError) -> R {
        let result = connection.withLock { (connection) -> Result<R, StoreFailure> in
            guard let connection else {
                return .failure(
                    StoreFailure(
                        FetchQError(
                            .state, "item store \(JSONPointer.quoted(path)) is closed")))
            }
            do throws(StoreFailure) {
                return .success(try body(connection))
            } catch {
                return .failure(error)
            }
        }
        switch result {
        case .success(let value): return value
        case .failure(let failure): throw failure.error
        }
    }

    private func parse(_ doc: [UInt8]) throws(FetchQError) -> JSONRef {
        do {
            return try JSONParser.parse(doc, maxDepth: JSONParser.janssonMaxDepth)
        } catch {
            throw FetchQError(
                .store,
                "item store \(JSONPointer.quoted(path)): a stored document is not valid "
                    + "JSON: \(error.message)")
        }
    }

    private static func check(collection: String) throws(FetchQError) {
        guard !collection.isEmpty else {
            throw FetchQError(.invalid, "item store: the collection name is empty")
        }
    }

    /// Compact JSON with sorted keys, or nil if jansson refuses (a reference cycle).
    static func canonical(_ value: UnsafeMutablePointer<json_t>) -> [UInt8]? {
        JSONRef.dumpBytes(value, compact: true, sorted: true)
    }

    static func nowMilliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }
}
