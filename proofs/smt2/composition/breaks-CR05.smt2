; placement-logic proof obligation: composition/breaks-CR05
; theorem: Composition
; breaking CR05 sequence-parallel-tp is refuted
;   statement refuted: Sequence parallel is only used with tensor parallel on the same axis, and parameters replicated over that axis (LayerNorm, biases) get their gradients reduced over it.  [plan: sequence parallel switched on with no tensor-parallel axis]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(check-sat)
(exit)
