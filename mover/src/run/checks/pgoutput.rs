//! The messages of PostgreSQL's `pgoutput` plugin (protocol version 1, text values), as
//! `pg_logical_slot_get_binary_changes` returns them, one message per row: only what change
//! tracking needs (relations, the rows' tuples, truncations); the rest is skipped.

/// A column value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Null,
    /// A TOASTed value the change left as it was: not sent.
    Unchanged,
    Text(String),
}

/// A relation as the stream describes it before its first change (in each decoding call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    /// `schema.table`, unquoted.
    pub name: String,
    /// `d` (default: the primary key), `i` (an index), `f` (full), `n` (nothing).
    pub identity: u8,
    /// Column names, with whether each is part of the replica identity.
    pub columns: Vec<(String, bool)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Relation(Relation),
    /// An insert, update or delete: every tuple it carries (old key or old row, new row).
    Row {
        relation: u32,
        tuples: Vec<Vec<Value>>,
    },
    Truncate(Vec<u32>),
    /// Begin, commit, origin, type, logical message: nothing to track.
    Other,
}

/// A message that is not what `pgoutput` sends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("truncated message"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, Malformed> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn cstr(&mut self) -> Result<String, Malformed> {
        let end = self
            .0
            .iter()
            .position(|b| *b == 0)
            .ok_or(Malformed("unterminated string"))?;
        let s = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[end + 1..];
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Vec<Value>, Malformed> {
        let n = self.i16()?;
        (0..n)
            .map(|_| match self.u8()? {
                b'n' => Ok(Value::Null),
                b'u' => Ok(Value::Unchanged),
                b't' | b'b' => {
                    let len = self.u32()? as usize;
                    Ok(Value::Text(
                        String::from_utf8_lossy(self.take(len)?).into_owned(),
                    ))
                }
                _ => Err(Malformed("unknown tuple value kind")),
            })
            .collect()
    }
}

pub(crate) fn parse(data: &[u8]) -> Result<Message, Malformed> {
    let mut r = Reader(data);
    Ok(match r.u8()? {
        b'R' => {
            let id = r.u32()?;
            let schema = r.cstr()?;
            let table = r.cstr()?;
            let identity = r.u8()?;
            let n = r.i16()?;
            let columns = (0..n)
                .map(|_| {
                    let flags = r.u8()?;
                    let name = r.cstr()?;
                    r.take(8)?; // type oid and modifier
                    Ok((name, flags & 1 == 1))
                })
                .collect::<Result<_, Malformed>>()?;
            Message::Relation(Relation {
                id,
                name: format!("{schema}.{table}"),
                identity,
                columns,
            })
        }
        b'I' => {
            let relation = r.u32()?;
            r.u8()?; // 'N'
            Message::Row {
                relation,
                tuples: vec![r.tuple()?],
            }
        }
        b'U' | b'D' => {
            let relation = r.u32()?;
            let mut tuples = Vec::new();
            while !r.0.is_empty() {
                r.u8()?; // 'K', 'O' or 'N'
                tuples.push(r.tuple()?);
            }
            Message::Row { relation, tuples }
        }
        b'T' => {
            let n = r.u32()?;
            r.u8()?; // options
            Message::Truncate((0..n).map(|_| r.u32()).collect::<Result<_, _>>()?)
        }
        _ => Message::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages as PostgreSQL 15 sent them for `o (tenant text, id int, v text, PRIMARY KEY
    /// (tenant, id))`: the relation, `UPDATE o SET id = 2` (old key, new row), a truncate.
    #[test]
    fn relations_rows_and_truncations_are_read_as_sent() {
        let relation = b"R\0\0d\x89public\0o\0d\0\x03\x01tenant\0\0\0\0\x19\xff\xff\xff\xff\
                         \x01id\0\0\0\0\x17\xff\xff\xff\xff\0v\0\0\0\0\x19\xff\xff\xff\xff";
        assert_eq!(
            parse(relation),
            Ok(Message::Relation(Relation {
                id: 0x6489,
                name: "public.o".into(),
                identity: b'd',
                columns: vec![
                    ("tenant".into(), true),
                    ("id".into(), true),
                    ("v".into(), false)
                ],
            }))
        );
        let update = b"U\0\0d\x89K\0\x03t\0\0\0\x01at\0\0\0\x011nN\0\x03t\0\0\0\x01at\0\0\0\x012t\0\0\0\x01z";
        let text = |s: &str| Value::Text(s.into());
        assert_eq!(
            parse(update),
            Ok(Message::Row {
                relation: 0x6489,
                tuples: vec![
                    vec![text("a"), text("1"), Value::Null],
                    vec![text("a"), text("2"), text("z")]
                ],
            })
        );
        assert_eq!(
            parse(b"T\0\0\0\x01\0\0\0d\x89"),
            Ok(Message::Truncate(vec![0x6489]))
        );
        assert_eq!(parse(b"B\0\0"), Ok(Message::Other));
        assert_eq!(
            parse(b"I\0\0d\x89N\0\x01t\0\0\0\x09ab"),
            Err(Malformed("truncated message"))
        );
    }
}
