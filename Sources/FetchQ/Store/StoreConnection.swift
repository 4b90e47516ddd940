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
    private let sqlite: SQLiteConnection<StoreFailure>

    // Cached statements (prepared once with SQLITE_PREPARE_PERSISTENT, reset after each use;
    // BEGIN IMMEDIATE, COMMIT and ROLLBACK are cached by `sqlite`).
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
        sqlite = try SQLiteConnection(
            path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds
        ) { StoreFailure($0.fetchQError("item store", path: path), sqliteCode: $0.code) }
        try sqlite.setUp(configure)
    }

    /// Finalizes the statements and closes the connection; idempotent. The last connection
    /// to a WAL database checkpoints it and removes the `-wal` file.
    func close() {
        sqlite.close()
    }

    // MARK: - Setup

    /// Configures the file, creates or checks the schema, then prepares the statements.
    private func configure() throws(StoreFailure) {
        // FULL: in WAL mode every commit fsyncs the log, so a committed upsert survives a
        // power loss or OS crash too, not only a crash of this process (NORMAL would keep
        // the database consistent but may roll back the last commits after a power loss).
        // The cost is one fsync per transaction, i.e. per response, small next to a
        // network round trip.
        try sqlite.useWriteAheadLogging(synchronous: "FULL")
        // A store set up before needs no write to open: read its marks
        // without the write lock, which another process may hold for as long
        // as its transaction lasts (waiting for it here blocked a search's
        // submit up to the busy timeout, then failed it: the ninth review).
        // (WAL: a reader waits for no writer.)
        if Int64(try sqlite.querySingle("PRAGMA application_id") ?? "0") == Self.applicationID,
           Int64(try sqlite.querySingle("PRAGMA user_version") ?? "0") == Self.schemaVersion {
            try prepareStatements()
            return
        }
        try sqlite.execute("BEGIN IMMEDIATE")
        do throws(StoreFailure) {
            let appID = Int64(try sqlite.querySingle("PRAGMA application_id") ?? "0") ?? 0
            let version = Int64(try sqlite.querySingle("PRAGMA user_version") ?? "0") ?? 0
            if appID != 0 && appID != Self.applicationID {
                throw sqlite.error(
                    "the file is an SQLite database of another application "
                        + "(application_id \(appID))")
            }
            if version > Self.schemaVersion {
                throw sqlite.error(
                    "schema version \(version) is newer than this library's "
                        + "(\(Self.schemaVersion))")
            }
            // `id` is the item's id as canonical JSON (compact, keys sorted), so the string
            // "1" is stored as "\"1\"" and the number 1 as "1"; `doc` is the item in the same
            // canonical form, so "unchanged" is a byte comparison done by SQLite.
            try sqlite.execute(
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
                try sqlite.execute("PRAGMA application_id=\(Self.applicationID)")
                try sqlite.execute("PRAGMA user_version=\(Self.schemaVersion)")
            }
            try sqlite.execute("COMMIT")
        } catch {
            sqlite.rollbackIfActive()
            throw error
        }
        try prepareStatements()
    }

    private func prepareStatements() throws(StoreFailure) {
        try sqlite.prepareTransactionStatements()
        insertIfAbsent = try sqlite.prepare(
            "INSERT INTO items (collection, id, doc, updated_at) VALUES (?1, ?2, ?3, ?4) "
                + "ON CONFLICT (collection, id) DO NOTHING")
        updateIfChanged = try sqlite.prepare(
            "UPDATE items SET doc = ?3, updated_at = ?4 "
                + "WHERE collection = ?1 AND id = ?2 AND doc IS NOT ?3")
        selectAll = try sqlite.prepare("SELECT id, doc FROM items WHERE collection = ?1 ORDER BY id")
        selectOne = try sqlite.prepare("SELECT doc FROM items WHERE collection = ?1 AND id = ?2")
        countAll = try sqlite.prepare("SELECT count(*) FROM items WHERE collection = ?1")
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
                    try write(updateIfChanged, "update item", collection, row, timestamp)
                    if sqlite.changes > 0 {
                        updated += 1
                        try afterWrite(index)
                        continue
                    }
                }
                try write(insertIfAbsent, "insert item", collection, row, timestamp)
                if sqlite.changes > 0 { inserted += 1 } else { unchanged += 1 }
                try afterWrite(index)
            }
            return (inserted, updated, unchanged)
        }
    }

    /// Runs the insert or update `statement` for one row.
    private func write(
        _ statement: OpaquePointer, _ what: String, _ collection: String,
        _ row: (id: [UInt8], doc: [UInt8]), _ timestamp: Int64
    ) throws(StoreFailure) {
        try sqlite.run(statement) { (s) throws(StoreFailure) in
            try sqlite.bind(collection, to: s, at: 1)
            try sqlite.bindText(row.id, to: s, at: 2)
            try sqlite.bindText(row.doc, to: s, at: 3)
            try sqlite.bind(timestamp, to: s, at: 4)
            try sqlite.stepDone(s, what)
        }
    }

    /// The stored documents of `collection` (canonical JSON text), ordered by id.
    /// Every (canonical id, document) of `collection`, in the order of the id texts' bytes.
    func documents(collection: String) throws(StoreFailure) -> [(id: [UInt8], doc: [UInt8])] {
        try sqlite.run(selectAll) { (s) throws(StoreFailure) in
            try sqlite.bind(collection, to: s, at: 1)
            var rows: [(id: [UInt8], doc: [UInt8])] = []
            while try sqlite.stepRow(s, "list items") {  // ends at SQLITE_DONE: one step per row
                rows.append((sqlite.columnTextBytes(s, 0), sqlite.columnTextBytes(s, 1)))
            }
            return rows
        }
    }

    /// The stored document with canonical id `id`, or nil.
    func document(collection: String, id: [UInt8]) throws(StoreFailure) -> [UInt8]? {
        try sqlite.run(selectOne) { (s) throws(StoreFailure) in
            try sqlite.bind(collection, to: s, at: 1)
            try sqlite.bindText(id, to: s, at: 2)
            return try sqlite.stepRow(s, "get item") ? sqlite.columnTextBytes(s, 0) : nil
        }
    }

    func count(collection: String) throws(StoreFailure) -> Int {
        try sqlite.run(countAll) { (s) throws(StoreFailure) in
            try sqlite.bind(collection, to: s, at: 1)
            guard try sqlite.stepRow(s, "count items") else { return 0 }
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
        try withFileSizeSignalHeld { () throws(StoreFailure) -> R in try transactionHeld(body) }
    }

    /// `transaction` with SIGXFSZ held (see `withFileSizeSignalHeld`).
    private func transactionHeld<R>(_ body: () throws(StoreFailure) -> R) throws(StoreFailure) -> R {
        var attempt = 1
        while true {
            do {
                try sqlite.beginImmediate("begin transaction")
                let result = try body()
                try sqlite.commit("commit")
                return result
            } catch {
                sqlite.rollbackIfActive()
                guard error.isBusy, attempt < Self.busyAttempts else { throw error }
                attempt += 1
                usleep(UInt32(10_000 * attempt))
            }
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
}
