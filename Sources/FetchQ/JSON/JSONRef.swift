import CJansson
import Synchronization

/// Owns exactly one jansson reference to a `json_t` and releases it (`json_decref`) when
/// the last Swift reference to this object goes away.
///
/// Ownership at the boundary is always explicit:
/// - ``init(owned:)`` *steals* a reference (use it for jansson's "new reference" results,
///   e.g. `json_loadb`, `json_object`, `json_array`);
/// - ``init(borrowed:)`` takes its own reference with `json_incref` (use it for jansson's
///   "borrowed reference" results, e.g. `json_array_get`, `json_object_get`);
/// - ``newReference()`` hands a +1 reference to C code that will `json_decref` it.
///
/// ## Why `@unchecked Sendable` is safe
///
/// There is no lock here; safety rests on two facts:
///
/// 1. **Reference counting is atomic.** In the installed jansson 2.14,
///    `jansson_config.h` defines `JSON_HAVE_ATOMIC_BUILTINS 1`, so `jansson.h` defines
///    `JANSSON_THREAD_SAFE_REFCOUNT 1` and `json_incref`/`json_decref` (static inline, so
///    compiled into *our* binary from that header) use `__atomic_add_fetch` /
///    `__atomic_sub_fetch`. The shared library itself was built the same way (its
///    internal decrefs are `lock subq` instructions). `jansson.h` says that with these
///    builtins the library is "thread safe for all read-only functions plus reference
///    counting". Caveat: the header uses ACQUIRE for increments and RELEASE for
///    decrements, with no acquire fence before `json_delete`; on x86-64 the locked
///    instructions are full barriers, and because values are never written after being
///    shared (point 2) there are no later writes the deleting thread could miss.
/// 2. **Values are immutable once shared, by convention.** The mutating helpers
///    (``append(_:)``, ``set(_:_:)``) may only be used while a value is being built and is
///    still owned by a single thread. Everything else (lookups, `json_dumps`, iteration)
///    is read-only in jansson 2.14: the encoder detects cycles with a private hashtable of
///    parents instead of marking the values it visits.
///
/// jansson reports allocation failure by returning NULL; the constructors here treat that
/// as fatal, like Swift's own allocator does.
public final class JSONRef: @unchecked Sendable {
    /// The owned `json_t`. Borrowed by anyone who reads it: valid while this object lives.
    public let pointer: UnsafeMutablePointer<json_t>

    /// Takes over (steals) one reference the caller owns; does not increment the count.
    /// Returns nil for NULL (jansson's failure result), so a jansson call can be wrapped
    /// directly: `JSONRef(owned: json_loadb(...))`.
    ///
    /// A convenience initializer, so that NULL allocates nothing: a failable designated
    /// initializer of a class allocates the object before its body runs and frees it again
    /// on `return nil` (a malloc and a free for every block operation that returned no
    /// value; bench/findings.md, "Tenth round").
    public convenience init?(owned pointer: UnsafeMutablePointer<json_t>?) {
        guard let pointer else { return nil }
        self.init(stealing: pointer)
    }

    /// Takes over (steals) one reference the caller owns (see ``init(owned:)``).
    public init(stealing pointer: UnsafeMutablePointer<json_t>) {
        self.pointer = pointer
    }

    /// Takes a new reference (`json_incref`) to a value the caller only borrows.
    public init(borrowed pointer: UnsafeMutablePointer<json_t>) {
        self.pointer = json_incref(pointer)
    }

    deinit {
        json_decref(pointer)
    }

    /// Returns the value with one extra reference owned by the caller ("new reference"):
    /// the receiver, usually C code, must balance it with `json_decref`.
    public func newReference() -> UnsafeMutablePointer<json_t> {
        json_incref(pointer)
    }

    // MARK: - Construction

    /// A new JSON string holding `value` (its UTF-8 bytes; NUL characters are kept).
    public static func string(_ value: String) -> JSONRef {
        var value = value
        // Swift strings are always valid UTF-8, so jansson's check would be redundant.
        let created = value.withUTF8 { utf8 in
            withJSONKeyChars(utf8) { json_stringn_nocheck($0, $1) }
        }
        return makeOrDie(created)
    }

    /// A new JSON integer.
    public static func integer(_ value: Int64) -> JSONRef {
        makeOrDie(json_integer(json_int_t(value)))
    }

    /// A new JSON real, or nil for NaN and infinities (not representable in JSON).
    public static func real(_ value: Double) -> JSONRef? {
        guard value.isFinite else { return nil }
        return makeOrDie(json_real(value))
    }

    /// JSON `true` or `false`.
    public static func bool(_ value: Bool) -> JSONRef {
        makeOrDie(value ? json_true() : json_false())
    }

    /// JSON `null`.
    public static func null() -> JSONRef {
        makeOrDie(json_null())
    }

    /// A new empty JSON object.
    public static func object() -> JSONRef {
        makeOrDie(json_object())
    }

    /// A new empty JSON array.
    public static func array() -> JSONRef {
        makeOrDie(json_array())
    }

    /// A new JSON array holding (referencing, not copying) `items` in order.
    public static func array(_ items: [JSONRef]) -> JSONRef {
        let result = array()
        for item in items { result.append(item) }
        return result
    }

    static func makeOrDie(_ pointer: UnsafeMutablePointer<json_t>?) -> JSONRef {
        guard let value = JSONRef(owned: pointer) else { fatalError("jansson: out of memory") }
        return value
    }

    // MARK: - Building (only before the value is shared)

    /// Appends a reference to `item` (no copy). Only valid on an array that has not been
    /// shared with other threads yet.
    public func append(_ item: JSONRef) {
        precondition(jsonType(of: pointer) == JSON_ARRAY, "append on a non-array JSON value")
        if json_array_append(pointer, item.pointer) != 0 { fatalError("jansson: out of memory") }
    }

    /// Sets `key` to a reference to `value` (no copy). Only valid on an object that has not
    /// been shared with other threads yet.
    public func set(_ key: String, _ value: JSONRef) {
        precondition(jsonType(of: pointer) == JSON_OBJECT, "set on a non-object JSON value")
        var key = key
        let status = key.withUTF8 { utf8 in
            withJSONKeyChars(utf8) { json_object_setn_nocheck(pointer, $0, $1, value.pointer) }
        }
        if status != 0 { fatalError("jansson: out of memory") }
    }

    // MARK: - Reading

    /// jansson's type tag.
    public var type: json_type { jsonType(of: pointer) }

    /// True for arrays.
    public var isArray: Bool { type == JSON_ARRAY }
    /// True for objects.
    public var isObject: Bool { type == JSON_OBJECT }
    /// True for `null`.
    public var isNull: Bool { type == JSON_NULL }

    /// The string's contents (NUL characters included), or nil if this is not a string.
    public var stringValue: String? {
        guard type == JSON_STRING, let chars = json_string_value(pointer) else { return nil }
        let bytes = UnsafeRawBufferPointer(start: chars, count: json_string_length(pointer))
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The integer, or nil if this is not a JSON integer (reals are not converted).
    public var integerValue: Int64? {
        type == JSON_INTEGER ? Int64(json_integer_value(pointer)) : nil
    }

    /// The number as a Double (integers converted), or nil if this is not a number.
    public var doubleValue: Double? {
        switch type {
        case JSON_INTEGER, JSON_REAL: return json_number_value(pointer)
        default: return nil
        }
    }

    /// The boolean, or nil if this is not `true`/`false`.
    public var boolValue: Bool? {
        switch type {
        case JSON_TRUE: return true
        case JSON_FALSE: return false
        default: return nil
        }
    }

    /// Number of elements of an array or members of an object; 0 for scalars.
    public var count: Int {
        switch type {
        case JSON_ARRAY: return json_array_size(pointer)
        case JSON_OBJECT: return json_object_size(pointer)
        default: return 0
        }
    }

    /// The array element at `index` (a new Swift reference to the same value), or nil.
    public subscript(index: Int) -> JSONRef? {
        guard index >= 0, let item = json_array_get(pointer, index) else { return nil }
        return JSONRef(borrowed: item)
    }

    /// The object member named `key` (a new Swift reference to the same value), or nil.
    public subscript(key: String) -> JSONRef? {
        var key = key
        let found = key.withUTF8 { utf8 in withJSONKeyChars(utf8) { json_object_getn(pointer, $0, $1) } }
        return found.map { JSONRef(borrowed: $0) }
    }

    /// The array's elements, each as a new Swift reference (no copies). Empty for non-arrays.
    public var elements: [JSONRef] {
        guard isArray else { return [] }
        let n = json_array_size(pointer)
        var result: [JSONRef] = []
        result.reserveCapacity(n)
        for i in 0..<n {
            if let item = json_array_get(pointer, i) { result.append(JSONRef(borrowed: item)) }
        }
        return result
    }

    /// True if both values are equal by jansson's `json_equal` (deep, key order ignored).
    public func isEqual(to other: JSONRef) -> Bool {
        json_equal(pointer, other.pointer) != 0
    }

    // MARK: - Encoding

    /// Encodes the value as JSON text (any value, scalars included).
    ///
    /// - Parameters:
    ///   - compact: no whitespace (`JSON_COMPACT`); otherwise indented by 2 spaces.
    ///   - sorted: object keys sorted by their bytes (`JSON_SORT_KEYS`), giving a
    ///     canonical form for equal values.
    /// - Returns: the text; empty only if the value contains a reference cycle, which can
    ///   only be built with ``append(_:)``/``set(_:_:)`` misuse and which jansson refuses
    ///   to encode.
    public func dumps(compact: Bool = true, sorted: Bool = false) -> String {
        guard let bytes = dumpBytes(compact: compact, sorted: sorted) else { return "" }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Like ``dumps(compact:sorted:)`` but returns the UTF-8 bytes, or nil on failure.
    public func dumpBytes(compact: Bool = true, sorted: Bool = false) -> [UInt8]? {
        JSONRef.dumpBytes(pointer, compact: compact, sorted: sorted)
    }

    /// Encodes a borrowed `json_t` (see ``dumps(compact:sorted:)``).
    public static func dumpBytes(
        _ value: UnsafePointer<json_t>, compact: Bool = true, sorted: Bool = false
    ) -> [UInt8]? {
        var flags = Int(JSON_ENCODE_ANY)
        flags |= compact ? Int(JSON_COMPACT) : 2  // JSON_INDENT(2) is a function-like macro
        if sorted { flags |= Int(JSON_SORT_KEYS) }
        var out: [UInt8] = []
        let status = withUnsafeMutablePointer(to: &out) { outPtr in
            json_dump_callback(value, { chunk, size, context in
                guard let chunk, let context else { return -1 }
                let sink = context.assumingMemoryBound(to: [UInt8].self)
                sink.pointee.append(contentsOf: UnsafeRawBufferPointer(start: chunk, count: size))
                return 0
            }, outPtr, flags)
        }
        return status == 0 ? out : nil
    }
}

extension JSONRef: CustomStringConvertible {
    /// Compact JSON text.
    public var description: String { dumps() }
}

/// `json_typeof` is a macro; this is its function form.
@inline(__always)
func jsonType(of value: UnsafePointer<json_t>) -> json_type {
    value.pointee.type
}

/// Calls `body` with `bytes` as a `const char *` and its length; an empty buffer (which may
/// have no base address) is passed as a valid pointer to an empty C string.
@inline(__always)
func withJSONKeyChars<R>(
    _ bytes: UnsafeBufferPointer<UInt8>, _ body: (UnsafePointer<CChar>, Int) -> R
) -> R {
    if let base = bytes.baseAddress {
        return base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
            body($0, bytes.count)
        }
    }
    var empty: CChar = 0
    return withUnsafePointer(to: &empty) { body($0, 0) }
}

/// A `JSONRef` built on first use and shared by every reader: published in
/// an atomic word (0, or the bits of an `Unmanaged<JSONRef>` holding one
/// retain) by the first thread to build it. A thread that lost the race
/// frees its own copy and uses the winner's. Used by a result's response
/// parts (headers, metrics) and by a result's value made from its body.
extension JSONRef {
    /// The object published in `slot`, building and publishing it first if
    /// needed (nil, and nothing published, when `make` gives nil).
    static func published(in slot: borrowing Atomic<UInt>, _ make: () -> JSONRef?) -> JSONRef? {
        if let p = UnsafeRawPointer(bitPattern: slot.load(ordering: .acquiring)) {
            return Unmanaged<JSONRef>.fromOpaque(p).takeUnretainedValue()
        }
        guard let value = make() else { return nil }
        let made = Unmanaged.passRetained(value)
        let (won, current) = slot.compareExchange(
            expected: 0, desired: UInt(bitPattern: made.toOpaque()), ordering: .acquiringAndReleasing)
        if won { return made.takeUnretainedValue() }
        made.release()
        return Unmanaged<JSONRef>.fromOpaque(UnsafeRawPointer(bitPattern: current)!).takeUnretainedValue()
    }

    /// Drops the retain a published slot holds (its owner's deinit).
    static func releasePublished(_ slot: borrowing Atomic<UInt>) {
        if let p = UnsafeRawPointer(bitPattern: slot.load(ordering: .acquiring)) {
            Unmanaged<JSONRef>.fromOpaque(p).release()
        }
    }
}
