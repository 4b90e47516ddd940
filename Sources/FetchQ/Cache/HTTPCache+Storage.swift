import CSQLite
import Glibc

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
        /// Short: writes happen under the cache's lock, which every GET's
        /// submit takes, so another writer holding the file's lock must not
        /// stall them for long. A write that cannot get it in time is
        /// skipped (the entry stays in memory) and reported once in the log.
        static let busyTimeoutMilliseconds: Int32 = 100

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
        private let sqlite: SQLiteConnection<FetchQError>
        private var upsert: OpaquePointer!
        private var selectOne: OpaquePointer!
        private var deleteOne: OpaquePointer!
        private var updateSeq: OpaquePointer!
        private var selectURL: OpaquePointer!
        /// The `seq` of the next write.
        private var nextSequence: Int64 = 1

        init(path: String) throws(FetchQError) {
            self.path = path
            // A new file is readable by its owner only: responses may be private.
            let created = Self.createPrivately(path)
            do throws(FetchQError) {
                guard sqlite3_threadsafe() != 0 else {
                    throw FetchQError(.store, "http cache: SQLite was built without thread support")
                }
                sqlite = try SQLiteConnection(
                    path: path, busyTimeoutMilliseconds: Self.busyTimeoutMilliseconds
                ) { $0.fetchQError("http cache", path: path) }
                try sqlite.setUp(configure)
            } catch {
                if let created { unlink(created) }  // refused: leave no empty file behind
                throw error
            }
            identity = Self.identity(of: path).id
        }

        /// Creates the file `path` names, readable and writable by its owner
        /// only, through symbolic links too (a link to a file not made yet:
        /// SQLite made that one with the default mode, 0644 under umask 022:
        /// the ninth review). The path of the file made; nil when one was
        /// there (or none could be made: SQLite says why).
        static func createPrivately(_ path: String) -> String? {
            var target = path
            for _ in 0..<16 {  // (a loop of links ends here)
                let fd = open(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
                if fd >= 0 {
                    Glibc.close(fd)
                    return target
                }
                guard errno == EEXIST else { return nil }
                // A link: its target, relative to the link's directory.
                var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
                let n = readlink(target, &buffer, buffer.count - 1)
                guard n > 0 else { return nil }  // (not a link: the file is there)
                let link = String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                if link.hasPrefix("/") {
                    target = link
                } else if let slash = target.utf8.lastIndex(of: UInt8(ascii: "/")) {
                    target = String(target[...slash]) + link
                } else {
                    target = link
                }
            }
            return nil
        }

        func close() {
            sqlite.close()
        }

        /// The file the path named when it was opened (device and inode); nil if that
        /// could not be read.
        private var identity: (dev_t, ino_t)?

        /// The device and inode `path` names; nil if it names none (`gone`: ENOENT or
        /// ENOTDIR) or cannot be read (another error, such as EACCES).
        private static func identity(of path: String) -> (id: (dev_t, ino_t)?, gone: Bool) {
            var info = stat()
            guard stat(path, &info) == 0 else { return (nil, errno == ENOENT || errno == ENOTDIR) }
            return ((info.st_dev, info.st_ino), false)
        }

        enum FileState { case same, deleted, replaced }

        /// Whether the path still names the file opened: `deleted` when it names none,
        /// `replaced` when it names another. (A path that cannot be looked at now, a
        /// directory made unsearchable, counts as the same: the open file is written as
        /// before.)
        var fileState: FileState {
            guard let identity else { return .same }
            let now = Self.identity(of: path)
            guard let id = now.id else { return now.gone ? .deleted : .same }
            return id == identity ? .same : .replaced
        }

        // MARK: - Setup

        /// Configures the file, checks it and creates the table, then prepares the
        /// statements.
        private func configure() throws(FetchQError) {
            // NORMAL: in WAL mode a commit is not fsynced, so a power loss may lose the last
            // writes; the file stays consistent. Losing cache entries is harmless.
            try sqlite.useWriteAheadLogging(synchronous: "NORMAL")
            let appID = Int64(try sqlite.querySingle("PRAGMA application_id") ?? "0") ?? 0
            guard appID == 0 || appID == Self.itemStoreApplicationID else {
                throw sqlite.error(
                    "the file is an SQLite database of another application "
                        + "(application_id \(appID))")
            }
            try sqlite.execute(
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
            try prepareStatements()
        }

        /// Preparing checks the columns: a table of the same name with another layout
        /// fails here.
        private func prepareStatements() throws(FetchQError) {
            try sqlite.prepareTransactionStatements()
            upsert = try sqlite.prepare(
                "INSERT OR REPLACE INTO fetchq_http_cache (key, status, headers, body, "
                    + "stored_at, initial_age, fresh_until, etag, last_modified, flags, size, seq) "
                    + "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)")
            selectOne = try sqlite.prepare(
                "SELECT status, headers, body, stored_at, initial_age, fresh_until, etag, "
                    + "last_modified, flags, size FROM fetchq_http_cache WHERE key = ?1")
            deleteOne = try sqlite.prepare("DELETE FROM fetchq_http_cache WHERE key = ?1")
            updateSeq = try sqlite.prepare("UPDATE fetchq_http_cache SET seq = ?2 WHERE key = ?1")
            selectURL = try sqlite.prepare(
                "SELECT key FROM fetchq_http_cache WHERE key = ?1 OR substr(key, 1, length(?2)) = ?2")
        }

        /// Reads the index of stored rows, keeps the newest that fit in `maxBytes` and
        /// deletes the rest; returns the kept ones as cold entries.
        func openIndex(maxBytes: Int) throws(FetchQError) -> ColdIndex {
            var kept: [(key: String, size: Int)] = []
            var dropped: [String] = []
            var total = 0
            var maxSequence: Int64 = 0
            let sql = "SELECT key, size, seq FROM fetchq_http_cache ORDER BY seq DESC"
            try sqlite.query(sql, "list entries") { (statement) throws(FetchQError) in
                while try sqlite.stepRow(statement, "list entries") {
                    let key = sqlite.columnText(statement, 0) ?? ""
                    let size = Int(sqlite3_column_int64(statement, 1))
                    maxSequence = max(maxSequence, Int64(sqlite3_column_int64(statement, 2)))
                    if dropped.isEmpty, size >= 0, total + size <= maxBytes {
                        total += size
                        kept.append((key, size))
                    } else {
                        dropped.append(key)
                    }
                }
            }
            nextSequence = maxSequence + 1
            if !dropped.isEmpty { try write(nil, deleting: dropped) }
            return ColdIndex(rows: kept.reversed())
        }

        // MARK: - Operations (the caller holds the cache's lock)

        /// The row for `key`, or nil.
        func read(_ key: String) throws(FetchQError) -> Row? {
            try sqlite.run(selectOne) { (s) throws(FetchQError) -> Row? in
                try sqlite.bind(key, to: s, at: 1)
                guard try sqlite.stepRow(s, "read entry") else { return nil }
                return Row(
                    key: key, status: Int64(sqlite3_column_int64(s, 0)),
                    headers: sqlite.columnBlob(s, 1), body: sqlite.columnBlob(s, 2),
                    storedAt: sqlite3_column_double(s, 3), initialAge: sqlite3_column_double(s, 4),
                    freshUntil: sqlite3_column_double(s, 5), etag: sqlite.columnText(s, 6),
                    lastModified: sqlite.columnText(s, 7), flags: Int64(sqlite3_column_int64(s, 8)),
                    cost: Int(sqlite3_column_int64(s, 9)))
            }
        }

        /// The keys of the rows that are `exact`, or start with `prefix`
        /// (rows another engine wrote since this one opened the file too).
        func keys(_ exact: String, orStartingWith prefix: String) throws(FetchQError) -> [String] {
            try sqlite.run(selectURL) { (s) throws(FetchQError) -> [String] in
                try sqlite.bind(exact, to: s, at: 1)
                try sqlite.bind(prefix, to: s, at: 2)
                var keys: [String] = []
                while try sqlite.stepRow(s, "find entries"), keys.count < 1_000_000 {
                    if let key = sqlite.columnText(s, 0) { keys.append(key) }
                }
                return keys
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
                try sqlite.run(updateSeq) { (s) throws(FetchQError) in
                    try sqlite.bind(key, to: s, at: 1)
                    try sqlite.check(sqlite3_bind_int64(s, 2, nextSequence), "bind")
                    try sqlite.stepDone(s, "touch entry")
                }
                nextSequence += 1
                try delete(keys)
            }
        }

        func deleteAll() throws(FetchQError) {
            try transaction { () throws(FetchQError) in
                try sqlite.execute("DELETE FROM fetchq_http_cache")
            }
        }

        private func writeRow(_ row: Row) throws(FetchQError) {
            try sqlite.run(upsert) { (s) throws(FetchQError) in
                try sqlite.bind(row.key, to: s, at: 1)
                try sqlite.check(sqlite3_bind_int64(s, 2, row.status), "bind")
                try sqlite.bindBlob(row.headers, to: s, at: 3)
                try sqlite.bindBlob(row.body, to: s, at: 4)
                try sqlite.check(sqlite3_bind_double(s, 5, row.storedAt), "bind")
                try sqlite.check(sqlite3_bind_double(s, 6, row.initialAge), "bind")
                try sqlite.check(sqlite3_bind_double(s, 7, row.freshUntil), "bind")
                if let etag = row.etag { try sqlite.bind(etag, to: s, at: 8) }  // unbound = NULL
                if let lastModified = row.lastModified {
                    try sqlite.bind(lastModified, to: s, at: 9)
                }
                try sqlite.check(sqlite3_bind_int64(s, 10, row.flags), "bind")
                try sqlite.check(sqlite3_bind_int64(s, 11, Int64(row.cost)), "bind")
                try sqlite.check(sqlite3_bind_int64(s, 12, nextSequence), "bind")
                try sqlite.stepDone(s, "write entry")
            }
            nextSequence += 1
        }

        private func delete(_ keys: [String]) throws(FetchQError) {
            for key in keys {
                try sqlite.run(deleteOne) { (s) throws(FetchQError) in
                    try sqlite.bind(key, to: s, at: 1)
                    try sqlite.stepDone(s, "delete entry")
                }
            }
        }

        // MARK: - Transactions

        /// (SIGXFSZ held: see `withFileSizeSignalHeld`.)
        private func transaction(_ body: () throws(FetchQError) -> Void) throws(FetchQError) {
            try withFileSizeSignalHeld { () throws(FetchQError) in
                do throws(FetchQError) {
                    try sqlite.beginImmediate("begin")
                    try body()
                    try sqlite.commit("commit")
                } catch {
                    sqlite.rollbackIfActive()
                    throw error
                }
            }
        }
    }
}
