import CJansson

/// One owned jansson reference (json_decref in deinit).
///
/// `@unchecked Sendable`: by convention a JSONRef's value is not mutated
/// after it has been handed to another thread. jansson 2.14 updates
/// reference counts with atomic builtins, so sharing is safe.
public final class JSONRef: @unchecked Sendable {
    public let pointer: UnsafeMutablePointer<json_t>

    /// Takes over `owned` (a new reference). nil for a NULL pointer.
    public init?(owned: UnsafeMutablePointer<json_t>?) {
        guard let owned else { return nil }
        pointer = owned
    }

    /// Adds a reference to `borrowed`.
    public init(borrowed: UnsafeMutablePointer<json_t>) {
        pointer = json_incref(borrowed)
    }

    deinit { json_decref(pointer) }

    /// A new reference for a caller who will own it (json_incref while this
    /// object is certainly alive).
    public func newReference() -> UnsafeMutablePointer<json_t> { json_incref(pointer) }
}
