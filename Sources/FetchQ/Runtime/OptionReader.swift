import CFetchQSupport
import CJansson

/// Reads a JSON object of options strictly: every key must be read by
/// someone, with the right type, or `finish()` reports it. Errors name the
/// full key path (`options.retry.max`).
///
/// Runs for every submit, and a submit asks for two dozen keys of which an
/// options object holds a few. So an object of up to `FQS_KEYS_MAX` keys is
/// scanned once into `keys` (fq_keys.h), and each lookup compares the key's
/// length and bytes with those few (no hashing, no allocation); which were
/// read is a bit mask there. Larger objects are looked up in jansson. Keys
/// are `StaticString`s (the literals at the call sites): their bytes are at
/// hand without a copy.
struct OptionReader {
    private let object: UnsafeMutablePointer<json_t>?
    let context: String
    /// The object's number of keys.
    private let size: Int
    /// The keys, in jansson's order, when the object is scanned.
    private var keys = fqs_keys()
    /// Whether the object is small enough to be scanned into `keys`.
    private var scanned: Bool { size <= Int(FQS_KEYS_MAX) }
    /// Larger objects: the keys present that were read, each once.
    private var consumed: [StaticString] = []

    /// `json` is borrowed; nil means "no options".
    init(_ json: UnsafePointer<json_t>?, context: String) throws(FetchQError) {
        self.context = context
        guard let json else {
            object = nil
            size = 0
            return
        }
        guard json.pointee.type == JSON_OBJECT else {
            throw FetchQError(.invalid, "\(context): expected a JSON object, got \(jsonTypeName(json))")
        }
        let object = UnsafeMutablePointer(mutating: json)
        self.object = object
        size = json_object_size(json)
        guard scanned else { return }
        var iter = json_object_iter(object)
        while let it = iter,
              fqs_keys_add(&keys, json_object_iter_key(it), json_object_iter_key_len(it), json_object_iter_value(it)) == 1 {
            iter = json_object_iter_next(object, it)
        }
    }

    /// `key` spelled by the `length` bytes at `bytes` (a jansson key may
    /// hold NUL: the length decides, not a terminator).
    private static func matches(_ key: StaticString, _ bytes: UnsafePointer<CChar>?, _ length: Int) -> Bool {
        key.withUTF8Buffer { k in
            k.count == length && k.elementsEqual(UnsafeRawBufferPointer(start: bytes, count: length))
        }
    }

    /// A larger object's value for `key`, through jansson.
    private func lookUp(_ key: StaticString) -> UnsafeMutablePointer<json_t>? {
        guard let object else { return nil }
        return key.withUTF8Buffer { k in
            k.withMemoryRebound(to: CChar.self) { json_object_getn(object, $0.baseAddress, k.count) }
        }
    }

    /// The raw value (borrowed), marking the key as read.
    mutating func value(_ key: StaticString) -> UnsafeMutablePointer<json_t>? {
        guard object != nil else { return nil }
        if scanned {
            let v = key.withUTF8Buffer { k in
                k.withMemoryRebound(to: CChar.self) { fqs_keys_take(&keys, $0.baseAddress, $0.count) }
            }
            return v?.assumingMemoryBound(to: json_t.self)
        }
        guard let v = lookUp(key) else { return nil }
        if !consumed.contains(where: { k in k.withUTF8Buffer { a in key.withUTF8Buffer { a.elementsEqual($0) } } }) {
            consumed.append(key)
        }
        return v
    }

    func path(_ key: StaticString) -> String { "\(context).\(key)" }

    /// Every key of the object was read (true for no options at all).
    var allRead: Bool {
        scanned ? keys.read == (1 << UInt(size)) - 1 : consumed.count == size
    }

    /// Whether the key is present (without reading it).
    mutating func has(_ key: StaticString) -> Bool {
        guard scanned else { return lookUp(key) != nil }
        return key.withUTF8Buffer { k in
            k.withMemoryRebound(to: CChar.self) { fqs_keys_find(&keys, $0.baseAddress, $0.count) >= 0 }
        }
    }

    func typeError(_ key: StaticString, _ expected: String, _ got: UnsafePointer<json_t>) -> FetchQError {
        FetchQError(.invalid, "\(path(key)): expected \(expected), got \(jsonTypeName(got))")
    }

    mutating func int(_ key: StaticString, in range: ClosedRange<Int>) throws(FetchQError) -> Int? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_INTEGER else { throw typeError(key, "an integer", v) }
        let n = json_integer_value(v)
        guard n >= Int64(range.lowerBound) && n <= Int64(range.upperBound) else {
            throw FetchQError(.invalid, "\(path(key)): \(n) is out of range \(range.lowerBound)...\(range.upperBound)")
        }
        return Int(n)
    }

    /// A number (integer or real) within `range`.
    mutating func number(_ key: StaticString, in range: ClosedRange<Double>) throws(FetchQError) -> Double? {
        guard let v = value(key) else { return nil }
        let d: Double
        switch v.pointee.type {
        case JSON_INTEGER: d = Double(json_integer_value(v))
        case JSON_REAL: d = json_real_value(v)
        default: throw typeError(key, "a number", v)
        }
        guard range.contains(d) else {
            throw FetchQError(.invalid, "\(path(key)): \(d) is out of range \(range.lowerBound)...\(range.upperBound)")
        }
        return d
    }

    mutating func bool(_ key: StaticString) throws(FetchQError) -> Bool? {
        guard let v = value(key) else { return nil }
        switch v.pointee.type {
        case JSON_TRUE: return true
        case JSON_FALSE: return false
        default: throw typeError(key, "true or false", v)
        }
    }

    mutating func string(_ key: StaticString) throws(FetchQError) -> String? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_STRING else { throw typeError(key, "a string", v) }
        return jsonString(v)
    }

    mutating func choice(_ key: StaticString, _ allowed: [String]) throws(FetchQError) -> String? {
        guard let s = try string(key) else { return nil }
        guard allowed.contains(where: { $0.utf8.elementsEqual(s.utf8) }) else {  // by bytes, as keys are
            throw FetchQError(.invalid, "\(path(key)): \"\(s)\" is not one of \(allowed.map { "\"\($0)\"" }.joined(separator: ", "))")
        }
        return s
    }

    /// A nested object, read with its own strict reader.
    mutating func object(_ key: StaticString) throws(FetchQError) -> OptionReader? {
        guard let v = value(key) else { return nil }
        guard v.pointee.type == JSON_OBJECT else { throw typeError(key, "an object", v) }
        return try OptionReader(v, context: path(key))
    }

    /// Fails on the first key nobody read (in jansson's order).
    mutating func finish() throws(FetchQError) {
        guard let object else { return }
        func unknown(_ bytes: UnsafePointer<CChar>?, _ length: Int) -> FetchQError {
            let key = String(decoding: UnsafeRawBufferPointer(start: bytes, count: length), as: UTF8.self)
            return FetchQError(.invalid, "\(context): unknown key \"\(key)\"")
        }
        if scanned {
            let i = fqs_keys_first_unread(&keys)
            if i >= 0 { throw unknown(fqs_keys_key(&keys, i), fqs_keys_length(&keys, i)) }
            return
        }
        // Every key read is a distinct key of the object: same count, none left.
        if consumed.count == size { return }
        var iter = json_object_iter(object)
        while let it = iter {
            let (bytes, length) = (json_object_iter_key(it), json_object_iter_key_len(it))
            if !consumed.contains(where: { Self.matches($0, bytes, length) }) { throw unknown(bytes, length) }
            iter = json_object_iter_next(object, it)
        }
    }
}

/// The key at a jansson object iterator as a Swift String, embedded NULs
/// kept: `String(cString:)` cut `"X-Tok\0Evil"` to a header `X-Tok` that was
/// sent, where a name with a NUL is no token (the tenth review).
func jsonKey(_ iter: UnsafeMutableRawPointer) -> String {
    String(decoding: UnsafeRawBufferPointer(start: json_object_iter_key(iter), count: json_object_iter_key_len(iter)),
           as: UTF8.self)
}

/// A jansson string value as a Swift String (embedded NULs kept; invalid
/// UTF-8 cannot occur: jansson validates).
func jsonString(_ v: UnsafePointer<json_t>) -> String {
    let length = json_string_length(v)
    guard let bytes = json_string_value(v) else { return "" }
    return bytes.withMemoryRebound(to: UInt8.self, capacity: length) {
        String(decoding: UnsafeBufferPointer(start: $0, count: length), as: UTF8.self)
    }
}

func jsonTypeName(_ v: UnsafePointer<json_t>) -> String {
    switch v.pointee.type {
    case JSON_OBJECT: "an object"
    case JSON_ARRAY: "an array"
    case JSON_STRING: "a string"
    case JSON_INTEGER: "an integer"
    case JSON_REAL: "a real number"
    case JSON_TRUE, JSON_FALSE: "a boolean"
    case JSON_NULL: "null"
    default: "an unknown JSON type"
    }
}
