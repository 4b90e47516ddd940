import CFetchQSupport
import FetchQ

// Conversions shared by the shims. No engine logic lives here.

/// The C caller's userdata: never dereferenced, only handed back to it.
struct UserData: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer?
}

/// Records `error` as the thread's last error and returns its status.
func fail(_ error: FetchQError) -> Int32 {
    fqs_set_last_error(error.status.rawValue, FetchQError.cText(error.message))
    return error.status.rawValue
}

func fail(_ status: FQStatus, _ message: String) -> Int32 {
    fail(FetchQError(status, message))
}

/// Runs a throwing call and maps it to FQ_OK or a negative status.
func status(_ body: () throws(FetchQError) -> Void) -> Int32 {
    do {
        try body()
        return FQStatus.ok.rawValue
    } catch {
        return fail(error)
    }
}

/// A static C string from a StaticString literal.
func cString(_ s: StaticString) -> UnsafePointer<CChar> {
    UnsafeRawPointer(s.utf8Start).assumingMemoryBound(to: CChar.self)
}

/// A C string whose invalid UTF-8 may become U+FFFD: only for messages.
func string(_ s: UnsafePointer<CChar>?) -> String? { s.map { String(cString: $0) } }

/// A C string argument called `what`. A name, key or query that is not
/// UTF-8 is refused rather than repaired: repairing would make different
/// byte strings the same one.
func utf8(_ s: UnsafePointer<CChar>, _ what: @autoclosure () -> String) throws(FetchQError) -> String {
    guard let text = String(validatingCString: s) else {
        throw FetchQError(.invalid, "\(what()) is not valid UTF-8")
    }
    return text
}

func engine(_ handle: OpaquePointer?) -> Engine? {
    handle.map { Unmanaged<Engine>.fromOpaque(UnsafeRawPointer($0)).takeUnretainedValue() }
}

func queue(_ handle: OpaquePointer?) -> Queue? { handle.map(Queue.from(handle:)) }

func operation(_ handle: OpaquePointer?) -> FetchQ.Operation? { handle.map(FetchQ.Operation.from(handle:)) }

func result(_ handle: OpaquePointer?) -> OperationResult? {
    handle.map { Unmanaged<OperationResult>.fromOpaque(UnsafeRawPointer($0)).takeUnretainedValue() }
}

let nullHandle = FetchQError(.invalid, "NULL handle")

/// Copies a message into a caller's error buffer, like strlcpy (the full
/// message stays available from fq_last_error()).
func copyMessage(_ message: String, into errbuf: UnsafeMutablePointer<CChar>?, _ errlen: Int) {
    guard let errbuf, errlen > 0 else { return }
    let bytes = Array(FetchQError.cText(message).utf8.prefix(errlen - 1))
    for (i, b) in bytes.enumerated() { errbuf[i] = CChar(bitPattern: b) }
    errbuf[bytes.count] = 0
}
