; placement-logic proof obligation: composition/breaks-CR03
; theorem: Composition
; breaking CR03 gather-sharded-axes is refuted
;   statement refuted: Every gather of an S* state ranges only over axes on which that state is sharded.  [plan: params gathered over y, where they are replicated]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x0 (>= size_y 2)))
(let (($x1 (and $x0 true)))
(or $x1))))
(check-sat)
(exit)
