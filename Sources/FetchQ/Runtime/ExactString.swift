/// A string compared and hashed by its UTF-8 bytes, for the names and keys
/// a caller gives (queries, queue and group names, paths, cache keys).
///
/// Swift's `String` equality is canonical equivalence: "\u{E9}" (é) equals
/// "e\u{301}" (e and a combining acute), and "\u{212A}" (the Kelvin sign)
/// equals "K". A C caller's strings are bytes, and a server, a file system
/// or SQLite tells those apart, so a `Set<String>` or `[String: …]` keyed
/// by them merged distinct values: two such queries of one search-all made
/// one request, two groups were cancelled as one (docs/reliability.md,
/// sixth review).
public struct ExactString: Hashable, Sendable, CustomStringConvertible {
    public let value: String

    public init(_ value: String) { self.value = value }

    public static func == (a: ExactString, b: ExactString) -> Bool {
        a.value.utf8.elementsEqual(b.value.utf8)
    }

    public func hash(into hasher: inout Hasher) {
        var copy = value  // withUTF8 may make the storage native: on a copy
        copy.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }

    public var description: String { value }
}
