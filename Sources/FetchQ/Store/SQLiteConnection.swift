import CFetchQSupport
import CSQLite
import Glibc

/// `SQLITE_TRANSIENT` (a macro, `((sqlite3_destructor_type)-1)`): SQLite copies the bytes
/// before the bind call returns.
private let sqliteTransient = unsafeBitCast(-1 as Int, to: sqlite3_destructor_type.self)

/// Runs `body`, a file write of the library's own (opening, a transaction, closing), with
/// SIGXFSZ held on this thread (`fqs_xfsz_hold`): past RLIMIT_FSIZE the write fails as an
/// I/O error instead of ending the host process, on any thread.
@inline(__always)
func withFileSizeSignalHeld<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
    let token = fqs_xfsz_hold()
    defer { fqs_xfsz_release(token) }
    return try body()
}

/// A failure inside ``SQLiteConnection``, before the component that owns the connection
/// (the item store, the HTTP cache) turns it into its own error with
/// ``fetchQError(_:path:)``.
struct SQLiteError: Error {
    enum Reason {
        /// The connection was closed.
        case closed
        /// Anything else; `detail` follows the component's `name "path": ` prefix.
        case failed(detail: String)
    }

    let reason: Reason
    let status: FQStatus
    /// SQLite's (extended) result code; 0 when the failure did not come from SQLite.
    let code: Int32

    /// The error as the component `component` (e.g. "item store") reports it for `path`:
    /// `component "path" is closed` or `component "path": detail`.
    func fetchQError(_ component: String, path: String) -> FetchQError {
        let subject = "\(component) \(JSONPointer.quoted(path))"
        switch reason {
        case .closed: return FetchQError(status, "\(subject) is closed")
        case .failed(let detail): return FetchQError(status, "\(subject): \(detail)")
        }
    }
}

/// One SQLite connection and the statements prepared on it: the plumbing shared by the
/// item store (``StoreConnection``) and the HTTP cache (``HTTPCache/CacheConnection``).
/// Schema, statements, transactions and durability stay with those components.
///
/// Every failure is an ``SQLiteError`` passed through the `mapError` given at opening, so
/// the methods throw the component's own error type, `Failure`.
///
/// Not thread-safe. It is opened with `SQLITE_OPEN_NOMUTEX` (SQLite's "multi-thread"
/// mode: a connection may move between threads but must never be used by two at once);
/// the owner serializes every use.
final class SQLiteConnection<Failure: Error> {
    let path: String
    /// The handle; nil once closed.
    private var db: OpaquePointer?
    /// The statements made by ``prepare(_:)``, finalized by ``close()``.
    private var statements: [OpaquePointer] = []
    // Made by ``prepareTransactionStatements()``.
    private var begin: OpaquePointer!
    private var commit: OpaquePointer!
    private var rollback: OpaquePointer?
    private let mapError: (SQLiteError) -> Failure

    /// Opens (creating if needed) the file read-write, turns on extended result codes and
    /// sets the busy timeout.
    init(
        path: String, busyTimeoutMilliseconds: Int32,
        mapError: @escaping (SQLiteError) -> Failure
    ) throws(Failure) {
        let held = fqs_xfsz_hold()  // opening may write (a -shm, a log's recovery)
        defer { fqs_xfsz_release(held) }
        self.path = path
        self.mapError = mapError
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &handle, flags, nil)
        guard rc == SQLITE_OK, let handle else {
            let reason = (rc & 0xFF) == SQLITE_CANTOPEN ? Self.creationReason(path) : nil
            let message =
                (handle.map { String(cString: sqlite3_errmsg($0)) }
                ?? String(cString: sqlite3_errstr(rc))) + (reason ?? Self.systemReason(handle, rc))
            sqlite3_close_v2(handle)
            throw mapError(
                SQLiteError(
                    reason: .failed(detail: "cannot open: \(message)"), status: .store, code: rc))
        }
        db = handle
        sqlite3_extended_result_codes(handle, 1)
        // Set before anything else takes a lock (switching to WAL does).
        sqlite3_busy_timeout(handle, busyTimeoutMilliseconds)
    }

    deinit { close() }

    /// Runs the owner's set-up (schema, statements) right after opening; if it fails,
    /// closes the connection and rethrows.
    func setUp(_ body: () throws(Failure) -> Void) throws(Failure) {
        do {
            try withFileSizeSignalHeld(body)
        } catch {
            close()
            throw error
        }
    }

    /// Finalizes the statements and closes the connection; idempotent. The last connection
    /// to a WAL database checkpoints it and removes the `-wal` file.
    func close() {
        for statement in statements { sqlite3_finalize(statement) }
        statements.removeAll()
        // The last connection checkpoints the log into the file.
        if let db { withFileSizeSignalHeld { () -> Void in _ = sqlite3_close_v2(db) } }
        db = nil
    }

    /// How long opening tries again to switch a file to write-ahead logging that another
    /// connection is busy with (see ``useWriteAheadLogging(synchronous:)``).
    static var walSwitchPatienceNanoseconds: UInt64 { 2_000_000_000 }

    /// Switches the file to write-ahead logging (`PRAGMA journal_mode=WAL`), failing if
    /// SQLite keeps another journal mode, then sets `PRAGMA synchronous=<synchronous>`.
    ///
    /// Several processes opening one new file at the same moment: the switch can fail at
    /// once with `SQLITE_BUSY`, without the busy handler (SQLite does not wait where
    /// waiting could deadlock), so it is tried again every 2 ms for up to 2 s (1 engine in
    /// 80 failed to start when 8 processes opened a new cache file together).
    func useWriteAheadLogging(synchronous: String) throws(Failure) {
        let sql = "PRAGMA journal_mode=WAL"
        let deadline = monotonicNanos() &+ Self.walSwitchPatienceNanoseconds
        var mode: String?
        while true {
            var statement: OpaquePointer?
            var rc = sqlite3_prepare_v2(try handle(), sql, -1, &statement, nil)
            if rc == SQLITE_OK, let statement {
                rc = sqlite3_step(statement)
                if rc == SQLITE_ROW { mode = columnText(statement, 0) }
            }
            sqlite3_finalize(statement)
            if rc == SQLITE_ROW { break }
            let busy = rc & 0xFF == SQLITE_BUSY || rc & 0xFF == SQLITE_LOCKED
            guard busy && monotonicNanos() < deadline else { throw failure(sql, rc) }
            usleep(2000)
        }
        guard mode == "wal" else {
            throw error(
                "cannot use write-ahead logging "
                    + "(journal mode is \(JSONPointer.quoted(mode ?? "unknown")))")
        }
        try execute("PRAGMA synchronous=\(synchronous)")
    }

    // MARK: - Statements

    /// Prepares a statement kept until ``close()`` (`SQLITE_PREPARE_PERSISTENT`); use it
    /// through ``run(_:_:)``.
    func prepare(_ sql: String) throws(Failure) -> OpaquePointer {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(
            try handle(), sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else {
            sqlite3_finalize(statement)
            throw failure("cannot prepare \(JSONPointer.quoted(sql))", rc)
        }
        statements.append(statement)
        return statement
    }

    /// Prepares `sql` once, runs `body` with it and finalizes it; a failure to prepare is
    /// reported as `what`.
    func query<R>(
        _ sql: String, _ what: String, _ body: (OpaquePointer) throws(Failure) -> R
    ) throws(Failure) -> R {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v2(try handle(), sql, -1, &statement, nil)
        guard rc == SQLITE_OK, let statement else {
            sqlite3_finalize(statement)
            throw failure(what, rc)
        }
        defer { sqlite3_finalize(statement) }
        return try body(statement)
    }

    /// Runs one statement and returns the first column of its first row as text, if any.
    @discardableResult
    func querySingle(_ sql: String) throws(Failure) -> String? {
        try query(sql, sql) { (statement) throws(Failure) in
            guard try stepRow(statement, sql) else { return nil }
            return columnText(statement, 0)
        }
    }

    /// Runs one statement, ignoring any rows.
    func execute(_ sql: String) throws(Failure) {
        try querySingle(sql)
    }

    /// Runs `body` with the prepared `statement`, then resets it and clears its bindings,
    /// so that no statement keeps a read transaction (and a WAL snapshot) open between
    /// calls. Fails if the connection is closed.
    func run<R>(
        _ statement: OpaquePointer, _ body: (OpaquePointer) throws(Failure) -> R
    ) throws(Failure) -> R {
        _ = try handle()
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        return try body(statement)
    }

    /// Steps a statement that returns no rows.
    func stepDone(_ statement: OpaquePointer, _ what: String) throws(Failure) {
        let rc = sqlite3_step(statement)
        guard rc == SQLITE_DONE else { throw failure(what, rc) }
    }

    /// Steps `statement`: true for a row, false at the end.
    func stepRow(_ statement: OpaquePointer, _ what: String) throws(Failure) -> Bool {
        switch sqlite3_step(statement) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let rc: throw failure(what, rc)
        }
    }

    /// The number of rows the last finished INSERT, UPDATE or DELETE changed.
    var changes: Int32 { db.map { sqlite3_changes($0) } ?? 0 }

    // MARK: - Transactions (the owner's transaction logic is built on these)

    /// Prepares the cached `BEGIN IMMEDIATE`, `COMMIT` and `ROLLBACK` statements.
    func prepareTransactionStatements() throws(Failure) {
        begin = try prepare("BEGIN IMMEDIATE")
        commit = try prepare("COMMIT")
        rollback = try prepare("ROLLBACK")
    }

    /// Runs the cached `BEGIN IMMEDIATE`; a failure is reported as `what`.
    func beginImmediate(_ what: String) throws(Failure) {
        try run(begin) { (s) throws(Failure) in try stepDone(s, what) }
    }

    /// Runs the cached `COMMIT`; a failure is reported as `what`.
    func commit(_ what: String) throws(Failure) {
        try run(commit) { (s) throws(Failure) in try stepDone(s, what) }
    }

    /// Rolls back the open transaction, if there is one (SQLite ends the transaction
    /// itself after some errors, e.g. SQLITE_FULL or SQLITE_IOERR), with the cached
    /// `ROLLBACK` statement or, before it is prepared, a one-off `ROLLBACK`.
    func rollbackIfActive() {
        guard let db, sqlite3_get_autocommit(db) == 0 else { return }
        if let rollback {
            sqlite3_step(rollback)
            sqlite3_reset(rollback)
        } else {
            sqlite3_exec(db, "ROLLBACK", nil, nil, nil)
        }
    }

    // MARK: - Binding

    /// Fails with SQLite's message for `rc` unless it is `SQLITE_OK`.
    func check(_ rc: Int32, _ what: String) throws(Failure) {
        guard rc == SQLITE_OK else { throw failure(what, rc) }
    }

    /// Binds `text` as TEXT (copied); an empty string binds `''`, never NULL.
    func bind(_ text: String, to statement: OpaquePointer, at index: Int32) throws(Failure) {
        var text = text
        let rc = text.withUTF8 { utf8 in bindText(utf8, statement, index) }
        try check(rc, "bind parameter \(index)")
    }

    /// Binds UTF-8 bytes as TEXT (copied); an empty array binds `''`, never NULL.
    func bindText(_ bytes: [UInt8], to statement: OpaquePointer, at index: Int32)
        throws(Failure)
    {
        let rc = bytes.withUnsafeBufferPointer { bindText($0, statement, index) }
        try check(rc, "bind parameter \(index)")
    }

    /// Binds bytes as a BLOB (copied); an empty array binds a zero-length blob, not NULL.
    func bindBlob(_ bytes: [UInt8], to statement: OpaquePointer, at index: Int32)
        throws(Failure)
    {
        let rc = bytes.withUnsafeBytes { raw -> Int32 in
            guard let base = raw.baseAddress, raw.count > 0 else {
                return sqlite3_bind_zeroblob(statement, index, 0)
            }
            return sqlite3_bind_blob64(
                statement, index, base, sqlite3_uint64(raw.count), sqliteTransient)
        }
        try check(rc, "bind parameter \(index)")
    }

    func bind(_ value: Int64, to statement: OpaquePointer, at index: Int32) throws(Failure) {
        let rc = sqlite3_bind_int64(statement, index, sqlite3_int64(value))
        try check(rc, "bind parameter \(index)")
    }

    private func bindText(
        _ bytes: UnsafeBufferPointer<UInt8>, _ statement: OpaquePointer, _ index: Int32
    ) -> Int32 {
        let empty: StaticString = ""
        let base = bytes.baseAddress ?? empty.utf8Start
        return base.withMemoryRebound(to: CChar.self, capacity: max(bytes.count, 1)) {
            sqlite3_bind_text64(
                statement, index, $0, sqlite3_uint64(bytes.count), sqliteTransient,
                UInt8(SQLITE_UTF8))
        }
    }

    // MARK: - Columns

    /// A TEXT column as a string; nil for NULL.
    func columnText(_ statement: OpaquePointer, _ column: Int32) -> String? {
        guard let text = sqlite3_column_text(statement, column) else { return nil }
        let count = Int(sqlite3_column_bytes(statement, column))
        return String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self)
    }

    /// A TEXT column's UTF-8 bytes; empty for NULL.
    func columnTextBytes(_ statement: OpaquePointer, _ column: Int32) -> [UInt8] {
        // Text first, then its length (the order SQLite documents as safe).
        guard let text = sqlite3_column_text(statement, column) else { return [] }
        let count = Int(sqlite3_column_bytes(statement, column))
        return Array(UnsafeBufferPointer(start: text, count: count))
    }

    /// A BLOB column's bytes; empty for NULL.
    func columnBlob(_ statement: OpaquePointer, _ column: Int32) -> [UInt8] {
        // The pointer first, then its length (the order SQLite documents as safe).
        guard let blob = sqlite3_column_blob(statement, column) else { return [] }
        let count = Int(sqlite3_column_bytes(statement, column))
        return Array(UnsafeRawBufferPointer(start: blob, count: count))
    }

    // MARK: - Errors

    /// The open handle; fails with `.state` once the connection is closed.
    func handle() throws(Failure) -> OpaquePointer {
        guard let db else {
            throw mapError(SQLiteError(reason: .closed, status: .state, code: 0))
        }
        return db
    }

    /// A failure (`.store`, no SQLite code) described by `detail`.
    func error(_ detail: String) -> Failure {
        mapError(SQLiteError(reason: .failed(detail: detail), status: .store, code: 0))
    }

    /// A failure naming the step `what` and SQLite's message for `rc`.
    func failure(_ what: String, _ rc: Int32) -> Failure {
        // A statement written over several lines (a CREATE TABLE) is named
        // by its first line.
        var what = what
        if let newline = what.firstIndex(of: "\n") {
            what = String(what[..<newline]) + " ..."
        }
        var message = String(cString: sqlite3_errstr(rc))
        if let db {
            let detail = String(cString: sqlite3_errmsg(db))
            if !detail.isEmpty && detail != "not an error" { message = detail }
        }
        let status: FQStatus = rc & 0xFF == SQLITE_NOMEM ? .noMemory : .store
        return mapError(
            SQLiteError(
                reason: .failed(detail: "\(what): \(message) (SQLite code \(rc))\(Self.systemReason(db, rc))"),
                status: status, code: rc))
    }

    /// ": REASON" when the file `path` names is not there and cannot be made
    /// in its directory (permission, a read-only file system, a missing
    /// directory); nil when it is there, or could be made (an attempt, the
    /// file removed at once).
    /// SQLite's own errno is that of its last attempt, a read-only open of
    /// the missing file: "No such file or directory" whatever the reason
    /// (the ninth review).
    static func creationReason(_ path: String) -> String? {
        // SQLite takes absolute paths of at most 512 bytes (SQLITE_MAX_PATHNAME);
        // the system more: such a file could be made, and the reason was
        // "No such file or directory" or "Invalid argument" (the tenth review).
        var absolute = path.utf8.count
        if !path.hasPrefix("/"), let cwd = getcwd(nil, 0) {
            absolute += strlen(cwd) + 1
            free(cwd)
        }
        if absolute >= 512 {
            return ": the path is \(absolute) bytes long as an absolute path, and SQLite takes at most 511"
        }
        var info = stat()
        if stat(path, &info) == 0 { return nil }
        guard errno == ENOENT else { return ": " + String(cString: strerror(errno)) }
        let directory: String
        if let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) {
            directory = slash == path.utf8.startIndex ? "/" : String(path[..<slash])
        } else {
            directory = "."
        }
        if access(directory, W_OK | X_OK) != 0 { return ": " + String(cString: strerror(errno)) }
        // access() says yes to root everywhere, where a file system may
        // still refuse (sysfs as root: "No such file or directory" was said,
        // the tenth review's check of its changes): trying tells.
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd < 0 else {
            Glibc.close(fd)
            unlink(path)
            return nil
        }
        return errno == EEXIST ? nil : ": " + String(cString: strerror(errno))
    }

    /// ": REASON" — the system's reason (strerror of the errno SQLite saw)
    /// when `rc` says a file could not be opened, read or written ("unable
    /// to open database file" alone does not say whether the directory is
    /// missing, read-only or out of descriptors); "" otherwise.
    static func systemReason(_ db: OpaquePointer?, _ rc: Int32) -> String {
        switch rc & 0xFF {
        case SQLITE_CANTOPEN, SQLITE_IOERR, SQLITE_FULL, SQLITE_READONLY, SQLITE_PERM:
            guard let db else { return "" }
            let errno = sqlite3_system_errno(db)
            return errno > 0 ? ": " + String(cString: strerror(errno)) : ""
        default:
            return ""
        }
    }
}
