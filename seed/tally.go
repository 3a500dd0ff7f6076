package seed

import "github.com/opencontainers/go-digest"

// Totals are what a node's complete seeds hold, for its status: each image and each
// manifest or blob counted once, however many seeds name it.
type Totals struct {
	Seeds, Images int
	// Bytes are the distinct manifests' and blobs' bytes: what the seeds keep in the
	// store, on disk already.
	Bytes int64
}

// Tally adds up the complete seeds recorded in dir (pending ones are not seeded yet).
// An unreadable record is an error: the store's prune is off until it is fixed.
func Tally(dir string) (Totals, error) {
	recs, err := Records(dir)
	if err != nil {
		return Totals{}, err
	}
	return tally(recs), nil
}

func tally(recs []*Record) Totals {
	var t Totals
	images := map[string]bool{}
	content := map[digest.Digest]bool{}
	for _, r := range recs {
		if !r.Complete {
			continue
		}
		t.Seeds++
		for _, i := range r.Images {
			images[i.Ref()] = true
		}
		for _, cs := range [][]Content{r.Manifests, r.Blobs} {
			for _, c := range cs {
				if !content[c.Digest] {
					content[c.Digest] = true
					t.Bytes += c.Size
				}
			}
		}
	}
	t.Images = len(images)
	return t
}

// Held are the manifests and blobs the complete seeds recorded in dir name, each once:
// what this node tells its peers it holds (pending seeds are not seeded yet).
func Held(dir string) ([]digest.Digest, error) {
	recs, err := Records(dir)
	if err != nil {
		return nil, err
	}
	seen := map[digest.Digest]bool{}
	var out []digest.Digest
	for _, r := range recs {
		if !r.Complete {
			continue
		}
		for _, cs := range [][]Content{r.Manifests, r.Blobs} {
			for _, c := range cs {
				if !seen[c.Digest] {
					seen[c.Digest] = true
					out = append(out, c.Digest)
				}
			}
		}
	}
	return out, nil
}
