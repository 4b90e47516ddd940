import CSQLite
import Glibc

/// A failure inside the store's SQLite layer: the error to report, plus SQLite's primary
/// result code (0 when the failure did not come from SQLite), so that the transaction
/// runner can tell a retryable `SQLITE_BUSY` from everything else.
struct StoreFailure: Error {
    let error: FetchQError
    let sqliteCode: Int32

    init(_ error: FetchQError, sqliteCode: Int32 = 0) {
        self.error = error
        self.sqliteCode = sqliteCode
    }

    var isBusy: Bool { sqliteCode & 0xFF == SQLITE_BUSY }
}

/// `SQLITE_TRANSIENT` (a macro, `((sqlite3_destructor_type)-1)`): SQLite copies the bytes
/// before the bind call returns.
private let sqliteTransient = unsafeBitCast(-1 as Int, to: sqlite3_destructor_type.self)

/// One SQLite connection to an item-store file with its prepared statements.
///
/// Not thread-safe. It is opened with `SQLITE_OPEN_NOMUTEX` (SQLite's "multi-thread"
/// mode: a connection may move between threads but must never be used by two at once),
/// and ``ItemStore`` only touches it while holding its mutex.
final class StoreConnection {
    /// The schema this code writes, stored in `PRAGMA user_version`.
    static let schemaVersion: Int64 = 1
    /// Marks the file as a fetchq item store: `PRAGMA application_id`, "fqis".
    static let applicationID: Int64 = 0x6671_6973

    /// How many times a transaction that failed with `SQLITE_BUSY` (after the busy timeout
    /// already waited) is rolled back and run again before the error is reported.
    static let busyAttempts = 3

    let path: String
    private(set) var db: OpaquePointer?
    private var statements: [OpaquePointer] = []

    // Cached statements (prepared once with SQLITE_PREPARE_PERSISTENT, reset after each use).
    private var begin: OpaquePointer!
    private var commit: OpaquePointer!
    private var rollback: OpaquePointer!
    private var insertIfAbsent: OpaquePointer!
    private var updateIfChanged: OpaquePointer!
    private var selectAll: OpaquePointer!
    private var selectOne: OpaquePointer!
    private var countAll: OpaquePointer!

    /// Test hook: called inside the write transaction after item `index` was written.
    /// Throwing aborts (rolls back) the transaction.
    var afterWriteHook: (@Sendable (Int) throws(FetchQError) -> Void)?

    /// Opens (creating if needed) the file, switches it to WAL with `synchronous=FULL`,
    /// creates or checks the schema, and prepares the statements.
    init(path: String, busyTimeoutMilliseconds: Int32) throws(StoreFailure) {
        self.path = path
        guard sqlite3_threadsafe() != 0 else {
            throw StoreFailure(
                FetchQError(
                    .store, "item store: the SQLite library was built without thread support"))
        }
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &handle, flags, nil)
        guard rc == SQLITE_OK, let handle else {
            let message =
                handle.map { String(cString: sqlite3_errmsg($0)) }
                ?? String(cString: sqlite3_errstr(rc))
            sqlite3_close_v2(handle)
            throw StoreFailure(
                FetchQError(.store, "item store \(Self.quoted(path)): cannot open: \(message)"),
                sqliteCode: rc)
        }
        db = handle
        do {
            sqlite3_extended_result_codes(handle, 1)
            // Set before anything else takes a lock (switching to WAL does).
            sqlite3_busy_timeout(handle, busyTimeoutMilliseconds)
            try configure()
            try prepareStatements()
        } catch {
            close()
            throw error
        }
    }

    deinit { close() }

    /// Finalizes the statements and closes the connection; idempotent. The last connection
    /// to a WAL database checkpoints it and removes the `-wal` file.
    func close() {
        for statement in statements { sqlite3_finalize(statement) }
        statements.removeAll()
        if let db { sqlite3_close_v2(db) }
        db = nil
    }

    // MARK: - Setup

    private func configure() throws(StoreFailure) {
        let mode = try pragma("PRAGMA journal_mode=WAL")
        guard mode == "wal" else {
            throw StoreFailure(
                FetchQError(
                    .store,
                    "item store \(Self.quoted(path)): cannot use write-ahead logging "
                        + "(journal mode is \(Self.quoted(mode ?? "unknown")))"))
        }
        // FULL: in WAL mode every commit fsyncs the log, so a committed upsert survives a
        // power loss or OS crash too, not only a crash of this process (NORMAL would keep
        // the database consistent but may roll back the last commits after a power loss).
        // The cost is one fsync per transaction, i.e. per response, small next to a
        // network round trip.
        _ = try pragma("PRAGMA synchronous=FULL")
        try execute("BEGIN IMMEDIATE")
        do throws(StoreFailure) {
            let appID = Int64(try pragma("PRAGMA application_id") ?? "0") ?? 0
            let version = Int64(try pragma("PRAGMA user_version") ?? "0") ?? 0
            if appID != 0 && appID != Self.applicationID {
                throw StoreFailure(
                    FetchQError(
                        .store,
                        "item store \(Self.quoted(path)): the file is an SQLite database "
                            + "of another application (application_id \(appID))"))
            }
            if version > Self.schemaVersion {
                throw StoreFailure(
                    FetchQError(
                        .store,
                        "item store \(Self.quoted(path)): schema version \(version) is "
                            + "newer than this library's (\(Self.schemaVersion))"))
            }
            // `id` is the item's id as canonical JSON (compact, keys sorted), so the string
            // "1" is stored as "\"1\"" and the number 1 as "1"; `doc` is the item in the same
            // canonical form, so "unchanged" is a byte comparison done by SQLite.
            try execute(
                """
                CREATE TABLE IF NOT EXISTS items (
                    collection TEXT NOT NULL,
                    id TEXT NOT NULL,
                    doc TEXT NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (collection, id)
                ) WITHOUT ROWID
                """)
            if version == 0 {
                try execute("PRAGMA application_id=\(Self.applicationID)")
                try execute("PRAGMA user_version=\(Self.schemaVersion)")
            }
            try execute("COMMIT")
        } catch {
            rollbackIfActive()
            throw error
        }
    }

    private func prepareStatements() throws(StoreFailure) {
        begin = try prepare("BEGIN IMMEDIATE")
        commit = try prepare("COMMIT")
        rollback = try prepare("ROLLBACK")
        insertIfAbsent = try prepare(
            "INSERT INTO items (collection, id, doc, updated_at) VALUES (?1, ?2, ?3, ?4) "
                + "ON CONFLICT (collection, id) DO NOTHING")
        updateIfChanged = try prepare(
            "UPDATE items SET doc = ?3, updated_at = ?4 "
                + "WHERE collection = ?1 AND id = ?2 AND doc IS NOT ?3")
        selectAll = try prepare("SELECT doc FROM items WHERE collection = ?1 ORDER BY id")
        selectOne = try prepare("SELECT doc FROM items WHERE collection = ?1 AND id = ?2")
        countAll = try prepare("SELECT count(*) FROM items WHERE collection = ?1")
    }

    private func prepare(_ sql: String) throws(StoreFailure) -> OpaquePointer {
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

    /// Runs one statement and returns the first column of its first row as text, if any.
    @discardableResult
    private func pragma(_ sql: String) throws(StoreFailure) -> String? {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v2(try handle(), sql, -1, &statement, nil)
        guard rc == SQLITE_OK, let statement else {
            sqlite3_finalize(statement)
            throw failure(sql, rc)
        }
        defer { sqlite3_finalize(statement) }
        switch sqlite3_step(statement) {
        case SQLITE_ROW:
            return sqlite3_column_text(statement, 0).map { String(cString: $0) }
        case SQLITE_DONE:
            return nil
        case let code:
            throw failure(sql, code)
        }
    }

    private func execute(_ sql: String) throws(StoreFailure) {
        try pragma(sql)
    }

    // MARK: - Operations (the caller holds the store's lock)

    /// Writes `rows` in one transaction; see ``ItemStore/upsert(collection:items:idPointer:merge:)``.
    func upsert(
        collection: String, rows: [(id: [UInt8], doc: [UInt8])], merge: ItemStore.Merge,
        timestamp: Int64
    ) throws(StoreFailure) -> (inserted: Int, updated: Int, unchanged: Int) {
        try transaction { () throws(StoreFailure) in
            var inserted = 0
            var updated = 0
            var unchanged = 0
            for (index, row) in rows.enumerated() {
                if merge == .overwrite {
                    try run(updateIfChanged, "update item") { (s) throws(StoreFailure) in
                        try bind(collection, to: s, at: 1)
                        try bind(row.id, to: s, at: 2)
                        try bind(row.doc, to: s, at: 3)
                        try bind(timestamp, to: s, at: 4)
                        try stepDone(s, "update item")
                    }
                    if sqlite3_changes(db) > 0 {
                        updated += 1
                        try afterWrite(index)
                        continue
                    }
                }
                try run(insertIfAbsent, "insert item") { (s) throws(StoreFailure) in
                    try bind(collection, to: s, at: 1)
                    try bind(row.id, to: s, at: 2)
                    try bind(row.doc, to: s, at: 3)
                    try bind(timestamp, to: s, at: 4)
                    try stepDone(s, "insert item")
                }
                if sqlite3_changes(db) > 0 { inserted += 1 } else { unchanged += 1 }
                try afterWrite(index)
            }
            return (inserted, updated, unchanged)
        }
    }

    /// The stored documents of `collection` (canonical JSON text), ordered by id.
    func documents(collection: String) throws(StoreFailure) -> [[UInt8]] {
        try run(selectAll, "list items") { (s) throws(StoreFailure) in
            try bind(collection, to: s, at: 1)
            var docs: [[UInt8]] = []
            while try stepRow(s, "list items") {  // ends at SQLITE_DONE: one step per row
                docs.append(columnBytes(s, 0))
            }
            return docs
        }
    }

    /// The stored document with canonical id `id`, or nil.
    func document(collection: String, id: [UInt8]) throws(StoreFailure) -> [UInt8]? {
        try run(selectOne, "get item") { (s) throws(StoreFailure) in
            try bind(collection, to: s, at: 1)
            try bind(id, to: s, at: 2)
            return try stepRow(s, "get item") ? columnBytes(s, 0) : nil
        }
    }

    func count(collection: String) throws(StoreFailure) -> Int {
        try run(countAll, "count items") { (s) throws(StoreFailure) in
            try bind(collection, to: s, at: 1)
            guard try stepRow(s, "count items") else { return 0 }
            return Int(sqlite3_column_int64(s, 0))
        }
    }

    // MARK: - Transactions

    /// Runs `body` between `BEGIN IMMEDIATE` and `COMMIT`; any error rolls everything back.
    ///
    /// `BEGIN IMMEDIATE` takes the write lock up front, so the busy timeout applies to
    /// waiting for another connection's write (a deferred transaction that reads first can
    /// get `SQLITE_BUSY` without waiting). If SQLite still reports busy (timeout expired,
    /// or one of the cases where it returns busy without calling the handler, such as WAL
    /// recovery by another process), the whole transaction is rolled back and rerun, at most
    /// ``busyAttempts`` times; `body` must therefore only change the database.
    private func transaction<R>(_ body: () throws(StoreFailure) -> R) throws(StoreFailure) -> R {
        var attempt = 1
        while true {
            do {
                try run(begin, "begin transaction") { (s) throws(StoreFailure) in
                    try stepDone(s, "begin transaction")
                }
                let result = try body()
                try run(commit, "commit") { (s) throws(StoreFailure) in try stepDone(s, "commit") }
                return result
            } catch {
                rollbackIfActive()
                guard error.isBusy, attempt < Self.busyAttempts else { throw error }
                attempt += 1
                usleep(UInt32(10_000 * attempt))
            }
        }
    }

    /// Rolls back the open transaction, if there is one (SQLite ends the transaction
    /// itself after some errors, e.g. SQLITE_FULL or SQLITE_IOERR).
    private func rollbackIfActive() {
        guard let db, sqlite3_get_autocommit(db) == 0 else { return }
        if let rollback {
            sqlite3_step(rollback)
            sqlite3_reset(rollback)
        } else {
            sqlite3_exec(db, "ROLLBACK", nil, nil, nil)
        }
    }

    private func afterWrite(_ index: Int) throws(StoreFailure) {
        guard let hook = afterWriteHook else { return }
        do {
            try hook(index)
        } catch {
            throw StoreFailure(error)
        }
    }

    // MARK: - Statement helpers

    /// Runs `body` with `statement`, then resets it and clears its bindings, so that no
    /// statement keeps a read transaction (and a WAL snapshot) open between calls.
    private func run<R>(
        _ statement: OpaquePointer, _ what: String,
        _ body: (OpaquePointer) throws(StoreFailure) -> R
    ) throws(StoreFailure) -> R {
        _ = try handle()
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        return try body(statement)
    }

    private func stepDone(_ statement: OpaquePointer, _ what: String) throws(StoreFailure) {
        let rc = sqlite3_step(statement)
        guard rc == SQLITE_DONE else { throw failure(what, rc) }
    }

    /// True for a row, false at the end.
    private func stepRow(_ statement: OpaquePointer, _ what: String) throws(StoreFailure) -> Bool {
        switch sqlite3_step(statement) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let rc: throw failure(what, rc)
        }
    }

    private func columnBytes(_ statement: OpaquePointer, _ column: Int32) -> [UInt8] {
        // Text first, then its length (the order SQLite documents as safe).
        guard let text = sqlite3_column_text(statement, column) else { return [] }
        let count = Int(sqlite3_column_bytes(statement, column))
        return Array(UnsafeBufferPointer(start: text, count: count))
    }

    private func bind(_ text: String, to statement: OpaquePointer, at index: Int32)
        throws(StoreFailure)
    {
        var text = text
        let rc = text.withUTF8 { utf8 in bindText(utf8, statement, index) }
        guard rc == SQLITE_OK else { throw failure("bind parameter \(index)", rc) }
    }

    private func bind(_ bytes: [UInt8], to statement: OpaquePointer, at index: Int32)
        throws(StoreFailure)
    {
        let rc = bytes.withUnsafeBufferPointer { bindText($0, statement, index) }
        guard rc == SQLITE_OK else { throw failure("bind parameter \(index)", rc) }
    }

    private func bind(_ value: Int64, to statement: OpaquePointer, at index: Int32)
        throws(StoreFailure)
    {
        let rc = sqlite3_bind_int64(statement, index, sqlite3_int64(value))
        guard rc == SQLITE_OK else { throw failure("bind parameter \(index)", rc) }
    }

    /// Binds UTF-8 bytes as TEXT (copied). An empty buffer binds `''`, never NULL.
    private func bindText(
        _ bytes: UnsafeBufferPointer<UInt8>, _ statement: OpaquePointer, _ index: Int32
    )
        -> Int32
    {
        let empty: StaticString = ""
        let base = bytes.baseAddress ?? empty.utf8Start
        return base.withMemoryRebound(to: CChar.self, capacity: max(bytes.count, 1)) {
            sqlite3_bind_text64(
                statement, index, $0, sqlite3_uint64(bytes.count), sqliteTransient,
                UInt8(SQLITE_UTF8))
        }
    }

    // MARK: - Errors

    private func handle() throws(StoreFailure) -> OpaquePointer {
        guard let db else {
            throw StoreFailure(FetchQError(.state, "item store \(Self.quoted(path)) is closed"))
        }
        return db
    }

    /// An error naming the file, the step and SQLite's message for `rc`.
    private func failure(_ what: String, _ rc: Int32) -> StoreFailure {
        var message = String(cString: sqlite3_errstr(rc))
        if let db {
            let detail = String(cString: sqlite3_errmsg(db))
            if !detail.isEmpty && detail != "not an error" { message = detail }
        }
        let status: FQStatus = rc & 0xFF == SQLITE_NOMEM ? .noMemory : .store
        return StoreFailure(
            FetchQError(
                status, "item store \(Self.quoted(path)): \(what): \(message) (SQLite code \(rc))"),
            sqliteCode: rc)
    }

    static func quoted(_ text: String) -> String {
        JSONPointer.quoted(text)
    }
}
