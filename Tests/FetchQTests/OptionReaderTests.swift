import CJansson
@testable import FetchQ
import Testing

/// The strict options reader: every key must be read, with the right type.
@Suite struct OptionReaderTests {
    static func object(_ text: String) throws -> JSONRef {
        try JSONParser.parse(text, maxDepth: 8)
    }

    static func finishError(_ text: String, read keys: [String], peek: [String] = []) throws -> String? {
        let json = try object(text)
        var r = try OptionReader(json.pointer, context: "options")
        for key in peek { _ = r.has(key) }
        for key in keys { _ = r.value(key) }
        do {
            try r.finish()
            return nil
        } catch {
            return error.message
        }
    }

    @Test func everyKeyReadFinishes() throws {
        #expect(try Self.finishError(#"{"a": 1, "b": true, "c": "x"}"#, read: ["c", "a", "b"]) == nil)
        #expect(try Self.finishError(#"{}"#, read: ["missing"]) == nil)
        // Reading a key twice counts it once.
        #expect(try Self.finishError(#"{"a": 1, "b": 2}"#, read: ["a", "a", "b"]) == nil)
        // Beyond the two keys kept inline too, in any order and repeated.
        let five = #"{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}"#
        #expect(try Self.finishError(five, read: ["e", "c", "e", "a", "c", "d", "b"]) == nil)
        #expect(try Self.finishError(five, read: ["e", "c", "c", "a", "d", "d"]) == #"options: unknown key "b""#)
        #expect(try Self.finishError(five, read: ["a", "b", "a", "b", "c", "d"]) == #"options: unknown key "e""#)
    }

    @Test func theFirstUnreadKeyIsReported() throws {
        #expect(try Self.finishError(#"{"a": 1, "b": 2, "c": 3}"#, read: ["a", "a", "missing"])
                == #"options: unknown key "b""#)
        // has() does not count as reading.
        #expect(try Self.finishError(#"{"a": 1, "b": 2}"#, read: ["b"], peek: ["a"])
                == #"options: unknown key "a""#)
    }

    @Test func typedReadersAndNestedObjects() throws {
        let json = try Self.object(#"{"n": 5, "flag": false, "mode": "x", "inner": {"k": 1, "extra": 2}}"#)
        var r = try OptionReader(json.pointer, context: "options")
        #expect(try r.int("n", in: 0...10) == 5)
        #expect(try r.bool("flag") == false)
        #expect(try r.choice("mode", ["x", "y"]) == "x")
        #expect(r.has("inner"))
        var inner = try #require(try r.object("inner"))
        #expect(try inner.int("k", in: 0...1) == 1)
        #expect(throws: FetchQError.self) { try inner.finish() }
        #expect(throws: FetchQError.self) { try r.int("mode", in: 0...1) }
        try r.finish()
    }

    @Test func lookupsAfterEveryKeyWasReadStillAnswerCorrectly() throws {
        let json = try Self.object(#"{"a": 7, "b": "x"}"#)
        var r = try OptionReader(json.pointer, context: "options")
        #expect(r.value("a").map { json_integer_value($0) } == 7)
        #expect(r.value("b").map { jsonString($0) } == "x")
        // Both keys read: absent keys answer nil, read keys still answer.
        #expect(r.value("c") == nil)
        #expect(r.value("a").map { json_integer_value($0) } == 7)
        #expect(r.value("b").map { jsonString($0) } == "x")
        try r.finish()
        // An unknown key is still found when fewer keys were read.
        #expect(try Self.finishError(#"{"a": 1, "zz": 2}"#, read: ["a", "b", "c"]) == #"options: unknown key "zz""#)
    }
}
