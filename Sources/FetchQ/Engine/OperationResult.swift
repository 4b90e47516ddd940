import CJansson
import Glibc

/// How an operation ended, as handed to its completion callback.
/// Immutable; `@unchecked Sendable` because its C string is owned and
/// never written after init.
public final class OperationResult: @unchecked Sendable {
    public let id: OpID
    public let outcome: Outcome
    /// `.ok` on success, else why it failed or was cancelled.
    public let status: FQStatus
    /// Why it failed or was cancelled; nil on success.
    public let message: String?
    /// The operation's value (nil if none).
    public let value: JSONRef?
    /// `message` as a C string for the C ABI (valid as long as the result).
    public let messageCString: UnsafeMutablePointer<CChar>?

    init(id: OpID, outcome: Outcome, status: FQStatus, message: String?, value: JSONRef?) {
        self.id = id
        self.outcome = outcome
        self.status = status
        self.message = message
        self.value = value
        messageCString = message.map { strdup($0) }
    }

    deinit { free(messageCString) }
}
