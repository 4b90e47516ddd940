import CJansson
import Testing

@testable import FetchQ

@Suite struct JSONPointerTests {
    /// The example document of RFC 6901 §5 (its keys exercise every escaping rule).
    static let rfcDocument = #"""
        {
          "foo": ["bar", "baz"],
          "": 0,
          "a/b": 1,
          "c%d": 2,
          "e^f": 3,
          "g|h": 4,
          "i\\j": 5,
          "k\"l": 6,
          " ": 7,
          "m~n": 8
        }
        """#

    func document() throws -> JSONRef {
        try JSONParser.parse(Self.rfcDocument, maxDepth: 8)
    }

    func resolve(_ pointer: String, in document: JSONRef) throws -> String? {
        try JSONPointer(pointer).resolve(in: document)?.dumps()
    }

    @Test func rfc6901Examples() throws {
        let doc = try document()
        // "" is the whole document.
        let whole = try #require(try JSONPointer("").resolve(in: doc))
        #expect(whole.pointer == doc.pointer)
        let expected: [(String, String)] = [
            ("/foo", #"["bar","baz"]"#),
            ("/foo/0", #""bar""#),
            ("/foo/1", #""baz""#),
            ("/", "0"),
            ("/a~1b", "1"),
            ("/c%d", "2"),
            ("/e^f", "3"),
            ("/g|h", "4"),
            (#"/i\j"#, "5"),
            (#"/k"l"#, "6"),
            ("/ ", "7"),
            ("/m~0n", "8"),
        ]
        for (pointer, value) in expected {
            #expect(try resolve(pointer, in: doc) == value, "\(pointer)")
        }
    }

    @Test func tokensAreDecoded() throws {
        #expect(try JSONPointer("").tokens == [])
        #expect(try JSONPointer("/").tokens == [""])
        #expect(try JSONPointer("//").tokens == ["", ""])
        #expect(try JSONPointer("/a~1b/m~0n").tokens == ["a/b", "m~n"])
        // ~01 is "~1" (decode ~1 first would give "~" + "1" → wrong order gives "/").
        #expect(try JSONPointer("/~01").tokens == ["~1"])
        #expect(try JSONPointer("/~10").tokens == ["/0"])
        #expect(try JSONPointer("/日本/é").tokens == ["日本", "é"])
    }

    @Test func descriptionRoundTrips() throws {
        for text in ["", "/", "/a~1b/m~0n", "/~01", "/foo/0", "/ /x y"] {
            #expect(try JSONPointer(text).description == text)
        }
        let built = JSONPointer(tokens: ["a/b", "~", ""])
        #expect(built.description == "/a~1b/~0/")
        #expect(try JSONPointer(built.description) == built)
    }

    @Test func invalidPointersAreErrors() throws {
        let cases: [(String, String)] = [
            ("foo", "must be empty or start with \"/\""),
            ("#/foo", "must be empty or start with \"/\""),
            ("/~2", "invalid escape \"~2\""),
            ("/a~", "invalid escape \"~\""),
            ("/~/x", "invalid escape \"~/\""),
        ]
        for (text, fragment) in cases {
            let error = #expect(throws: JSONPointerError.self) { try JSONPointer(text) }
            #expect(error?.pointer == text)
            #expect(error?.message.contains(fragment) == true, "\(text): \(error?.message ?? "")")
            #expect(error?.message.contains(JSONPointer.quoted(text)) == true, "\(text)")
        }
    }

    @Test func arrayIndexRules() throws {
        let doc = try JSONParser.parse(
            #"{"a":[10,11,12,13,14,15,16,17,18,19,20],"o":{"01":"key","-":"dash"}}"#,
            maxDepth: 4)
        #expect(try resolve("/a/0", in: doc) == "10")
        #expect(try resolve("/a/10", in: doc) == "20")
        #expect(try resolve("/a/11", in: doc) == nil)  // out of range
        #expect(try resolve("/a/-", in: doc) == nil)  // past the end never resolves
        #expect(try resolve("/a/01", in: doc) == nil)  // leading zero
        #expect(try resolve("/a/00", in: doc) == nil)
        #expect(try resolve("/a/-1", in: doc) == nil)
        #expect(try resolve("/a/+1", in: doc) == nil)
        #expect(try resolve("/a/1x", in: doc) == nil)
        #expect(try resolve("/a/", in: doc) == nil)
        #expect(try resolve("/a/99999999999999999999999999", in: doc) == nil)  // overflow
        // On objects the same tokens are plain keys.
        #expect(try resolve("/o/01", in: doc) == #""key""#)
        #expect(try resolve("/o/-", in: doc) == #""dash""#)
    }

    @Test func resolvingThroughScalarsOrMissingKeysIsNil() throws {
        let doc = try document()
        #expect(try resolve("/foo/0/x", in: doc) == nil)
        #expect(try resolve("/missing", in: doc) == nil)
        #expect(try resolve("/m~0", in: doc) == nil)  // the key "m~" does not exist
        #expect(try resolve("/foo/bar", in: doc) == nil)  // array, non-index token
    }

    @Test func keysWithNulBytesResolve() throws {
        let object = JSONRef.object()
        object.set("a\u{0}b", .integer(1))
        object.set("a", .integer(2))
        #expect(JSONPointer(tokens: ["a\u{0}b"]).resolve(in: object)?.integerValue == 1)
        #expect(try JSONPointer("/a").resolve(in: object)?.integerValue == 2)
    }

    @Test func resolveReturnsBorrowedPointer() throws {
        let doc = try document()
        let raw = try #require(try JSONPointer("/foo").resolve(in: doc.pointer))
        #expect(raw.pointee.refcount == 1)  // not incremented: borrowed from doc
        #expect(json_array_size(raw) == 2)
    }
}
