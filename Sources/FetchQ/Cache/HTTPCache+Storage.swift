import CSQLite
import Glibc

/// `SQLITE_TRANSIENT`: SQLite copies bound bytes before the bind call returns.
private let cacheSQLiteTransient = unsafeBitCast(-1 as Int, to: sqlite3_destructor_type.self)

extension HTTPCache {
    /// The SQLite side of a persistent ``HTTPCache``: one connection and its prepared
    /// statements on the table `fetchq_http_cache`.
    ///
    /// Not thread-safe: opened with `SQLITE_OPEN_NOMUTEX` and used only under the cache's
    /// mutex. Every change is one `BEGIN IMMEDIATE … COMMIT` transaction, so a store and the
    /// deletions of the entries it evicted land together or not at all.
    ///
    /// Table (a rowid table: bodies can be large):
    /// `key` (TEXT, unique), `status`, `headers` (BLOB: per header a little-endian UInt32
    /// length and the name's UTF-8, then the same for the value), `body` (BLOB),
    /// `stored_at`, `initial_age`, `fresh_until` (REAL seconds), `etag`, `last_modified`
    /// (TEXT or NULL), `flags` (1 = no-cache, 2 = must-revalidate), `size` (the entry's
    /// cost), `seq` (recency: larger is more recent, increasing across sessions).
    final class CacheConnection {
        /// The item store's `application_id` ("fqis"): a cache may share its file.
        static let itemStoreApplicationID: Int64 = 0x6671_6973
        static let busyTimeoutMilliseconds: Int32 = 2000

        /// A row, encoded outside the lock when possible.
        struct Row: Sendable {
            var key: String
            var status: Int64
            var headers: [UInt8]
            var body: [UInt8]
            var storedAt: Double
            var initialAge: Double
            var freshUntil: Double
            var etag: String?
            var lastModified: String?
            var flags: Int64
            var cost: Int

            init(key: String, entry: Entry, cost: Int) {
                self.key = key
                status = Int64(entry.status)
                headers = Self.encode(entry.headers)
                body = entry.body
                storedAt = entry.storedAt
                initialAge = entry.initialAge
                freshUntil = entry.freshUntil
                etag = entry.etag
                lastModified = entry.lastModified
                flags = (entry.noCache ? 1 : 0) | (entry.mustRevalidate ? 2 : 0)
                self.cost = cost
            }

            init(
                key: String, status: Int64, headers: [UInt8], body: [UInt8], storedAt: Double,
                initialAge: Double, freshUntil: Double, etag: String?, lastModified: String?,
                flags: Int64, cost: Int
            ) {
                self.key = key
                self.status = status
                self.headers = headers
                self.body = body
                self.storedAt = storedAt
                self.initialAge = initialAge
                self.freshUntil = freshUntil
                self.etag = etag
                self.lastModified = lastModified
                self.flags = flags
                self.cost = cost
            }

            /// The entry, or nil if the headers blob is damaged.
            var entry: Entry? {
                guard let decoded = Self.decode(headers) else { return nil }
                return Entry(
                    status: Int(status), headers: decoded, body: body, storedAt: storedAt,
                    initialAge: initialAge, freshUntil: freshUntil, etag: etag,
                    lastModified: lastModified, noCache: flags & 1 != 0,
                    mustRevalidate: flags & 2 != 0)
            }

            static func encode(_ headers: [(name: String, value: String)]) -> [UInt8] {
                var bytes: [UInt8] = []
                func append(_ text: String) {
                    let count = UInt32(truncatingIfNeeded: text.utf8.count)
                    for shift in stride(from: 0, to: 32, by: 8) {
                        bytes.append(UInt8(truncatingIfNeeded: count >> UInt32(shift)))
                    }
                    bytes.append(contentsOf: text.utf8)
                }
                for header in headers {
                    append(header.name)
                    append(header.value)
                }
                return bytes
            }

            static func decode(_ bytes: [UInt8]) -> [(name: String, value: String)]? {
                var headers: [(name: String, value: String)] = []
                var i = 0
                func text() -> String? {
                    guard bytes.count - i >= 4 else { return nil }
                    var count = 0
                    for k in 0..<4 { count |= Int(bytes[i + k]) << (8 * k) }
                    i += 4
                    guard bytes.count - i >= count else { return nil }
                    defer { i += count }
                    return String(decoding: bytes[i..<(i + count)], as: UTF8.self)
                }
                while i < bytes.count {
                    guard let name = text(), let value = text() else { return nil }
                    headers.append((name, value))
                }
                return headers
            }
        }

        let path: String
        private var db: OpaquePointer?
        private var statements: [OpaquePointer] = []
        private var begin: OpaquePointer!
        private var commit: OpaquePointer!
        private var rollback: OpaquePointer!
        private var upsert: OpaquePointer!
        private var selectOne: OpaquePointer!
        private var deleteOne: OpaquePointer!
        private var updateSeq: OpaquePointer!
        /// The `seq` of the next write.
        private var nextSequence: Int64 = 1

        init(path: String) throws(FetchQError) {
            self.path = path
            guard sqlite3_threadsafe() != 0 else {
                throw FetchQError(.store, "http cache: SQLite was built without thread support")
            }
            var handle: OpaquePointer?
            let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
            let rc = sqlite3_open_v2(path, &handle, flags, nil)
            guard rc == SQLITE_OK, let handle else {
                let message =
                    handle.map { String(cString: sqlite3_errmsg($0)) }
                    ?? String(cString: sqlite3_errstr(rc))
                sqlite3_close_v2(handle)
                throw FetchQError(
                    .store, "http cache \(Self.quoted(path)): cannot open: \(message)")
            }
            db = handle
            do {
                sqlite3_extended_result_codes(handle, 1)
                sqlite3_busy_timeout(handle, Self.busyTimeoutMilliseconds)
                try configure()
                try prepareStatements()
            } catch {
                close()
                throw error
            }
        }

        deinit { close() }

        func close() {
            for statement in statements { sqlite3_finalize(statement) }
            statements.removeAll()
            if let db { sqlite3_close_v2(db) }
            db = nil
        }

        // MARK: - Setup

        private func configure() throws(FetchQError) {
            let mode = try querySingle("PRAGMA journal_mode=WAL")
            guard mode == "wal" else {
                throw FetchQError(
                    .store,
                    "http cache \(Self.quoted(path)): cannot use write-ahead logging "
                        + "(journal mode is \(Self.quoted(mode ?? "unknown")))")
            }
            // NORMAL: in WAL mode a commit is not fsynced, so a power loss may lose the last
            // writes; the file stays consistent. Losing cache entries is harmless.
            try querySingle("PRAGMA synchronous=NORMAL")
            let appID = Int64(try querySingle("PRAGMA application_id") ?? "0") ?? 0
            guard appID == 0 || appID == Self.itemStoreApplicationID else {
                throw FetchQError(
                    .store,
                    "http cache \(Self.quoted(path)): the file is an SQLite database of "
                        + "another application (application_id \(appID))")
            }
            try querySingle(
                """
                CREATE TABLE IF NOT EXISTS fetchq_http_cache (
                    key TEXT NOT NULL PRIMARY KEY,
                    status INTEGER NOT NULL,
                    headers BLOB NOT NULL,
                    body BLOB NOT NULL,
                    stored_at REAL NOT NULL,
                    initial_age REAL NOT NULL,
                    fresh_until REAL NOT NULL,
                    etag TEXT,
                    last_modified TEXT,
                    flags INTEGER NOT NULL,
                    size INTEGER NOT NULL,
                    seq INTEGER NOT NULL
                )
                """)
        }

        /// Preparing checks the columns: a table of the same name with another layout
        /// fails here.
        private func prepareStatements() throws(FetchQError) {
            begin = try prepare("BEGIN IMMEDIATE")
            commit = try prepare("COMMIT")
            rollback = try prepare("ROLLBACK")
            upsert = try prepare(
                "INSERT OR REPLACE INTO fetchq_http_cache (key, status, headers, body, "
                    + "stored_at, initial_age, fresh_until, etag, last_modified, flags, size, seq) "
                    + "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)")
            selectOne = try prepare(
                "SELECT status, headers, body, stored_at, initial_age, fresh_until, etag, "
                    + "last_modified, flags, size FROM fetchq_http_cache WHERE key = ?1")
            deleteOne = try prepare("DELETE FROM fetchq_http_cache WHERE key = ?1")
            updateSeq = try prepare("UPDATE fetchq_http_cache SET seq = ?2 WHERE key = ?1")
        }

        /// Reads the index of stored rows, keeps the newest that fit in `maxBytes` and
        /// deletes the rest; returns the kept ones as cold entries.
        func openIndex(maxBytes: Int) throws(FetchQError) -> ColdIndex {
            var statement: OpaquePointer?
            let sql = "SELECT key, size, seq FROM fetchq_http_cache ORDER BY seq DESC"
            let rc = sqlite3_prepare_v2(try handle(), sql, -1, &statement, nil)
            guard rc == SQLITE_OK, let statement else {
                sqlite3_finalize(statement)
                throw failure("list entries", rc)
            }
            var kept: [(key: String, size: Int)] = []
            var dropped: [String] = []
            var total = 0
            var maxSequence: Int64 = 0
            defer { sqlite3_finalize(statement) }
            while try stepRow(statement, "list entries") {
                let key = columnText(statement, 0) ?? ""
                let size = Int(sqlite3_column_int64(statement, 1))
                maxSequence = max(maxSequence, Int64(sqlite3_column_int64(statement, 2)))
                if dropped.isEmpty, size >= 0, total + size <= maxBytes {
                    total += size
                    kept.append((key, size))
                } else {
                    dropped.append(key)
                }
            }
            sqlite3_reset(statement)
            nextSequence = maxSequence + 1
            if !dropped.isEmpty { try write(nil, deleting: dropped) }
            return ColdIndex(rows: kept.reversed())
        }

        // MARK: - Operations (the caller holds the cache's lock)

        /// The row for `key`, or nil.
        func read(_ key: String) throws(FetchQError) -> Row? {
            try run(selectOne) { (s) throws(FetchQError) -> Row? in
                try bind(key, s, 1)
                guard try stepRow(s, "read entry") else { return nil }
                return Row(
                    key: key, status: Int64(sqlite3_column_int64(s, 0)),
                    headers: columnBlob(s, 1), body: columnBlob(s, 2),
                    storedAt: sqlite3_column_double(s, 3), initialAge: sqlite3_column_double(s, 4),
                    freshUntil: sqlite3_column_double(s, 5), etag: columnText(s, 6),
                    lastModified: columnText(s, 7), flags: Int64(sqlite3_column_int64(s, 8)),
                    cost: Int(sqlite3_column_int64(s, 9)))
            }
        }

        /// In one transaction: writes `row` (if any) as the most recent, deletes `keys`.
        func write(_ row: Row?, deleting keys: [String]) throws(FetchQError) {
            try transaction { () throws(FetchQError) in
                if let row { try writeRow(row) }
                try delete(keys)
            }
        }

        /// In one transaction: marks `key` as the most recent, deletes `keys`.
        func touch(_ key: String, deleting keys: [String]) throws(FetchQError) {
            try transaction { () throws(FetchQError) in
                try run(updateSeq) { (s) throws(FetchQError) in
                    try bind(key, s, 1)
                    try check(sqlite3_bind_int64(s, 2, nextSequence), "bind")
                    try stepDone(s, "touch entry")
                }
                nextSequence += 1
                try delete(keys)
            }
        }

        func deleteAll() throws(FetchQError) {
            try transaction { () throws(FetchQError) in
                try querySingle("DELETE FROM fetchq_http_cache")
            }
        }

        private func writeRow(_ row: Row) throws(FetchQError) {
            try run(upsert) { (s) throws(FetchQError) in
                try bind(row.key, s, 1)
                try check(sqlite3_bind_int64(s, 2, row.status), "bind")
                try bind(row.headers, s, 3)
                try bind(row.body, s, 4)
                try check(sqlite3_bind_double(s, 5, row.storedAt), "bind")
                try check(sqlite3_bind_double(s, 6, row.initialAge), "bind")
                try check(sqlite3_bind_double(s, 7, row.freshUntil), "bind")
                if let etag = row.etag { try bind(etag, s, 8) }  // unbound = NULL
                if let lastModified = row.lastModified { try bind(lastModified, s, 9) }
                try check(sqlite3_bind_int64(s, 10, row.flags), "bind")
                try check(sqlite3_bind_int64(s, 11, Int64(row.cost)), "bind")
                try check(sqlite3_bind_int64(s, 12, nextSequence), "bind")
                try stepDone(s, "write entry")
            }
            nextSequence += 1
        }

        private func delete(_ keys: [String]) throws(FetchQError) {
            for key in keys {
                try run(deleteOne) { (s) throws(FetchQError) in
                    try bind(key, s, 1)
                    try stepDone(s, "delete entry")
                }
            }
        }

        // MARK: - Helpers

        private func transaction(_ body: () throws(FetchQError) -> Void) throws(FetchQError) {
            do {
                try run(begin) { (s) throws(FetchQError) in try stepDone(s, "begin") }
                try body()
                try run(commit) { (s) throws(FetchQError) in try stepDone(s, "commit") }
            } catch {
                if let db, sqlite3_get_autocommit(db) == 0 {
                    sqlite3_step(rollback)
                    sqlite3_reset(rollback)
                }
                throw error
            }
        }

        private func prepare(_ sql: String) throws(FetchQError) -> OpaquePointer {
            var statement: OpaquePointer?
            let rc = sqlite3_prepare_v3(
                try handle(), sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
            guard rc == SQLITE_OK, let statement else {
                sqlite3_finalize(statement)
                throw failure("cannot prepare \(Self.quoted(sql))", rc)
            }
            statements.append(statement)
            return statement
        }

        /// Runs one statement; returns the first column of its first row as text, if any.
        @discardableResult
        private func querySingle(_ sql: String) throws(FetchQError) -> String? {
            var statement: OpaquePointer?
            let rc = sqlite3_prepare_v2(try handle(), sql, -1, &statement, nil)
            guard rc == SQLITE_OK, let statement else {
                sqlite3_finalize(statement)
                throw failure(sql, rc)
            }
            defer { sqlite3_finalize(statement) }
            guard try stepRow(statement, sql) else { return nil }
            return columnText(statement, 0)
        }

        /// Runs `body` with `statement`, then resets it and clears its bindings.
        private func run<R>(
            _ statement: OpaquePointer, _ body: (OpaquePointer) throws(FetchQError) -> R
        ) throws(FetchQError) -> R {
            _ = try handle()
            defer {
                sqlite3_reset(statement)
                sqlite3_clear_bindings(statement)
            }
            return try body(statement)
        }

        private func stepDone(_ statement: OpaquePointer, _ what: String) throws(FetchQError) {
            let rc = sqlite3_step(statement)
            guard rc == SQLITE_DONE else { throw failure(what, rc) }
        }

        private func stepRow(_ statement: OpaquePointer, _ what: String) throws(FetchQError)
            -> Bool
        {
            switch sqlite3_step(statement) {
            case SQLITE_ROW: return true
            case SQLITE_DONE: return false
            case let rc: throw failure(what, rc)
            }
        }

        private func check(_ rc: Int32, _ what: String) throws(FetchQError) {
            guard rc == SQLITE_OK else { throw failure(what, rc) }
        }

        private func bind(_ text: String, _ statement: OpaquePointer, _ index: Int32)
            throws(FetchQError)
        {
            var text = text
            let rc = text.withUTF8 { utf8 -> Int32 in
                let empty: StaticString = ""
                let base = utf8.baseAddress ?? empty.utf8Start
                return base.withMemoryRebound(to: CChar.self, capacity: max(utf8.count, 1)) {
                    sqlite3_bind_text64(
                        statement, index, $0, sqlite3_uint64(utf8.count), cacheSQLiteTransient,
                        UInt8(SQLITE_UTF8))
                }
            }
            try check(rc, "bind parameter \(index)")
        }

        /// Binds bytes as a BLOB (copied); an empty array binds a zero-length blob, not NULL.
        private func bind(_ bytes: [UInt8], _ statement: OpaquePointer, _ index: Int32)
            throws(FetchQError)
        {
            let rc = bytes.withUnsafeBytes { raw -> Int32 in
                guard let base = raw.baseAddress, raw.count > 0 else {
                    return sqlite3_bind_zeroblob(statement, index, 0)
                }
                return sqlite3_bind_blob64(
                    statement, index, base, sqlite3_uint64(raw.count), cacheSQLiteTransient)
            }
            try check(rc, "bind parameter \(index)")
        }

        private func columnText(_ statement: OpaquePointer, _ column: Int32) -> String? {
            guard let text = sqlite3_column_text(statement, column) else { return nil }
            let count = Int(sqlite3_column_bytes(statement, column))
            return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
        }

        private func columnBlob(_ statement: OpaquePointer, _ column: Int32) -> [UInt8] {
            // The pointer first, then its length (the order SQLite documents as safe).
            guard let blob = sqlite3_column_blob(statement, column) else { return [] }
            let count = Int(sqlite3_column_bytes(statement, column))
            return Array(UnsafeRawBufferPointer(start: blob, count: count))
        }

        private func handle() throws(FetchQError) -> OpaquePointer {
            guard let db else {
                throw FetchQError(.state, "http cache \(Self.quoted(path)) is closed")
            }
            return db
        }

        private func failure(_ what: String, _ rc: Int32) -> FetchQError {
            var message = String(cString: sqlite3_errstr(rc))
            if let db {
                let detail = String(cString: sqlite3_errmsg(db))
                if !detail.isEmpty && detail != "not an error" { message = detail }
            }
            let status: FQStatus = rc & 0xFF == SQLITE_NOMEM ? .noMemory : .store
            return FetchQError(
                status, "http cache \(Self.quoted(path)): \(what): \(message) (SQLite code \(rc))")
        }

        static func quoted(_ text: String) -> String {
            JSONPointer.quoted(text)
        }
    }
}
