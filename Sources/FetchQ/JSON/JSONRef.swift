import CJansson

/// Placeholder until the JSON layer lands: one owned jansson reference.
/// `@unchecked Sendable`: not mutated after being shared; jansson 2.14
/// updates reference counts atomically.
public final class JSONRef: @unchecked Sendable {
    public let raw: UnsafeMutablePointer<json_t>
    public init(owned raw: UnsafeMutablePointer<json_t>) { self.raw = raw }
    public init(borrowed raw: UnsafeMutablePointer<json_t>) { self.raw = json_incref(raw) }
    public static func adopt(_ raw: UnsafeMutablePointer<json_t>?) -> JSONRef? { raw.map { JSONRef(owned: $0) } }
    deinit { json_decref(raw) }
    public func newReference() -> UnsafeMutablePointer<json_t> { json_incref(raw) }
}
