import CJansson
@testable import FetchQ
import Testing

/// The strict options reader: every key must be read, with the right type.
@Suite struct OptionReaderTests {
    static func object(_ text: String) throws -> JSONRef {
        try JSONParser.parse(text, maxDepth: 8)
    }

    static func finishError(_ text: String, read keys: [StaticString], peek: [StaticString] = []) throws -> String? {
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
        // Several keys, in any order and repeated.
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
        let hasInner = r.has("inner")  // (mutating: not inside #expect)
        #expect(hasInner)
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

    /// Up to 8 keys the object is scanned into a small table (fq_keys.h);
    /// beyond, keys are looked up in jansson. Both must answer the same.
    @Test(arguments: [1, 7, 8, 9, 12])
    func smallAndLargeObjectsAnswerAlike(count: Int) throws {
        let names: [StaticString] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11"]
        let text = "{" + (0..<count).map { "\"k\($0)\": \($0)" }.joined(separator: ", ") + "}"
        let json = try Self.object(text)
        var r = try OptionReader(json.pointer, context: "options")
        let absent = [r.value("absent"), r.value("k"), r.value("k00")]
        #expect(absent.allSatisfy { $0 == nil })
        for i in stride(from: count - 1, through: 0, by: -1) {
            let present = r.has(names[i])
            let first = r.value(names[i]).map { json_integer_value($0) }
            let again = r.value(names[i]).map { json_integer_value($0) }
            #expect(present && first == Int64(i) && again == Int64(i))
            #expect(r.allRead == (i == 0))
        }
        try r.finish()
        // Every key but one read: that one is reported, whichever it is.
        for skip in [0, count / 2, count - 1] {
            let read = (0..<count).filter { $0 != skip }.map { names[$0] }
            #expect(try Self.finishError(text, read: read + ["absent"]) == "options: unknown key \"k\(skip)\"")
        }
    }

    @Test func keysThatShareAPrefixOrALengthAreTold() throws {
        let json = try Self.object(#"{"parse": 1, "parse_x": 2, "pars": 3, "qarse": 4, "": 5}"#)
        var r = try OptionReader(json.pointer, context: "options")
        let parse = r.value("parse").map { json_integer_value($0) }
        let pars = r.value("pars").map { json_integer_value($0) }
        let near = [r.value("parsf"), r.value("parse_"), r.value("Parse")]
        #expect(parse == 1 && pars == 3 && near.allSatisfy { $0 == nil })
        var early = r
        #expect(throws: FetchQError.self) { try early.finish() }  // parse_x, qarse and "" unread
        let empty = r.value("").map { json_integer_value($0) }
        let qarse = r.value("qarse").map { json_integer_value($0) }
        #expect(empty == 5 && qarse == 4 && !r.allRead)
        let parseX = r.value("parse_x").map { json_integer_value($0) }
        #expect(parseX == 2 && r.allRead)
        try r.finish()
    }
}
