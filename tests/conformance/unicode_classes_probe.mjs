// Which code points Oniguruma (inside HF tokenizers) puts in each Unicode class.
import { createRequire } from "module";
const require = createRequire("/work/main/tests/conformance/x.js");
const { Tokenizer } = require("@anush008/tokenizers");
function pre(regex) {
  const j = {version:"1.0",truncation:null,padding:null,added_tokens:[],normalizer:null,
    pre_tokenizer:{type:"Split",pattern:{Regex:regex},behavior:"Removed",invert:false},
    post_processor:null,decoder:null,model:{type:"BPE",dropout:null,unk_token:null,continuing_subword_prefix:null,end_of_word_suffix:null,fuse_unk:false,byte_fallback:false,vocab:{},merges:[]}};
  return Tokenizer.fromString(JSON.stringify(j)).getPreTokenizer();
}
const classes = ["L","Lu","Ll","Lt","Lm","Lo","M","N","Nd","P","S","s"];
const out = {};
for (const k of classes) {
  const p = pre(k === "s" ? "\\S" : `\\P{${k}}`);
  const set = [];
  for (let start = 0; start < 0x110000; start += 4096) {
    let s = "";
    for (let c = start; c < start + 4096; ++c) {
      if (c >= 0xd800 && c <= 0xdfff) continue;
      s += String.fromCodePoint(c);
    }
    for (const [piece] of p.preTokenizeString(s)) for (const ch of piece) set.push(ch.codePointAt(0));
  }
  // as ranges
  const r = [];
  for (const c of set) { if (r.length && r[r.length-1][1] === c-1) r[r.length-1][1] = c; else r.push([c,c]); }
  out[k] = r;
}
console.log(JSON.stringify(out));
